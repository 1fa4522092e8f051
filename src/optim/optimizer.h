// Optimizers: the update rule applied to a weight given its gradient.
//
// The same code runs on servers (update_on_kvstore: the servers apply it to each merged gradient)
// and on workers (the worker pulls the merged gradient and updates locally), so both give identical
// results. An optimizer keeps its state (momentum, ...) per `index`: a key on a worker, a key and
// part on a server, which owns only some parts of a big array. All rules here are element-wise, so
// updating parts separately equals updating the whole.
//
// Threads: Update may be called concurrently for different indexes, never for the same one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

namespace dtrain {

// What is sent to servers to build the same optimizer there: a name and numeric parameters, with
// MXNet's names ("learning_rate", "momentum", "wd", "rescale_grad", "clip_gradient").
struct OptimizerSpec {
  std::string name;
  std::map<std::string, double> params;

  std::string ToJson() const;
  static OptimizerSpec FromJson(const std::string& json);  // throws InvalidArgument
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // weight -= f(grad, state[index]); grad and weight have the same length.
  virtual void Update(uint64_t index, std::span<float> weight, std::span<const float> grad) = 0;

  virtual const OptimizerSpec& spec() const = 0;
};

// Builds an optimizer by name. Throws InvalidArgument for an unknown name or parameter, or a bad
// value, naming it.
std::unique_ptr<Optimizer> CreateOptimizer(const OptimizerSpec& spec);

}  // namespace dtrain

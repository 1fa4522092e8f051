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

  // {"name": "sgd", "params": {"learning_rate": 0.1}}. Throws InvalidArgument for a value JSON
  // cannot carry (NaN, infinity, text that is not UTF-8).
  std::string ToJson() const;
  // The inverse of ToJson. The text comes off the network, so anything else (not JSON, other
  // fields, a non-numeric parameter) is an InvalidArgument saying what is wrong; never a crash.
  // Whether the name and parameters mean anything is CreateOptimizer's to check.
  static OptimizerSpec FromJson(const std::string& json);
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // weight -= f(grad, state[index]); grad and weight have the same length. The state of an index
  // is created (zeros) by its first Update and keeps that length. Throws InvalidArgument for
  // lengths that differ, from each other or from the index's earlier updates.
  virtual void Update(uint64_t index, std::span<float> weight, std::span<const float> grad) = 0;

  // The spec this optimizer was built from (a later set_learning_rate does not change it).
  virtual const OptimizerSpec& spec() const = 0;

  // The learning rate of the next Update: learning-rate schedules change it between steps. May be
  // called from any thread, also while Update runs (that Update uses the old or the new rate).
  // Throws InvalidArgument for a negative or non-finite rate.
  virtual void set_learning_rate(double learning_rate) = 0;
  virtual double learning_rate() const = 0;
};

// Builds an optimizer by name (case-insensitive; "sgd"). Throws InvalidArgument for an unknown name
// or parameter, or a bad value, naming it and what is accepted.
std::unique_ptr<Optimizer> CreateOptimizer(const OptimizerSpec& spec);

}  // namespace dtrain

// What every optimizer here shares: the spec and its checks, the base learning rate and its
// schedule, the state table (per index: the update count and a few float buffers as long as the
// weight), and the saved form of that state. A rule states its parameters, how many buffers it
// keeps, and its kernel (Apply).
//
// Saved state (SaveState; all integers little-endian, floats as their IEEE bits, little-endian):
//   "DTOS"            4 bytes, magic
//   version           u32, 1
//   name              u32 length (1..64), then the optimizer's name ("sgd", "adam", ...)
//   buffers           u32, state buffers per element: a rule's variant (SGD with or without
//                     momentum, RMSProp plain or centered) keeps a different number
//   learning rate     f64, the base rate (set_learning_rate's)
//   rate changes      version 2 only: u64 count (>= 1), then per change in increasing order of
//                     t: u64 t (1..2^53), f64 rate (set_learning_rate_from's). A state without
//                     changes is written as version 1, so either form is canonical.
//   indexes           u64 count, then per index in increasing order of index:
//                       u64 index, u64 update count (<= 2^53), u64 length n,
//                       buffers * n f32, buffer after buffer
// The index order makes the form canonical: LoadState of SaveState's bytes saves the same bytes.
//
// Threads: as Optimizer (optimizer.h). The table's lock is held only to find or add an index;
// Update then works on that index's buffers, which never move, without it.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/common/array.h"
#include "optim/kernels/device_launch.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "optim/optimizer_params.h"

namespace dtrain {

class ElementwiseOptimizer : public Optimizer {
 public:
  // The index's state buffers for the elements being updated: buffer k starts at state[k] and is
  // as long as the weight span Apply is given (zeros before the index's first update).
  struct StateBuffers {
    float* base;    // buffer 0 at the first element being updated
    size_t stride;  // elements between buffer k and k + 1: the index's whole length
    float* operator[](size_t k) const { return base + k * stride; }
  };

  void Update(uint64_t index, std::span<float> weight, std::span<const float> grad) final;
  void UpdateRows(uint64_t index, std::span<float> weight, size_t row_length,
                  std::span<const int64_t> rows, std::span<const float> grad) final;
  void UpdateOnDevice(uint64_t index, const Array& weight, const Array& grad) final;
  void SetParallelFor(ParallelFor parallel_for) final { parallel_for_ = std::move(parallel_for); }

  const OptimizerSpec& spec() const final { return spec_; }
  bool lazy_update() const final { return lazy_update_; }
  void set_learning_rate(double learning_rate) final;
  void set_learning_rate_from(uint64_t t, double learning_rate) final;
  double learning_rate() const final;
  double LearningRateAt(uint64_t t) const final;
  uint64_t UpdateCount(uint64_t index) const final;

  std::string SaveState() const final;
  void LoadState(const std::string& bytes) final;

 protected:
  // One update of one index, as the rule's kernel needs it.
  struct Step {
    uint64_t t;            // the index's update number, 1 for its first
    double learning_rate;  // the schedule's rate for t (double, as MXNet's Python has it)
  };

  // `state_name` names the rule in saved state; `own_params` are the parameter names the rule
  // reads besides "learning_rate" and the schedule's, which every rule accepts. Reads and checks
  // the learning rate (default `default_learning_rate`) and the schedule; the rule's constructor
  // then reads its own parameters through params().
  ElementwiseOptimizer(OptimizerSpec spec, std::string_view state_name,
                       std::vector<std::string_view> own_params, double default_learning_rate);

  const OptimizerParams& params() const { return params_; }

  // How many buffers of weight length each index keeps (0 by default). Set once, in the rule's
  // constructor.
  void set_state_buffers(size_t count) { state_buffers_ = count; }

  // weight -= f(grad, state), for a contiguous piece of an index's elements (Update may split an
  // index over threads). Must not throw.
  virtual void Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
                     StateBuffers state) = 0;
  // The same update of a whole index on a device (kernels/device_launch.h): queues it on
  // `target.stream` and returns; `target.state` holds the index's buffers there.
  virtual void ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) = 0;

 private:
  // An index's buffers live where its last update ran: on the host (`buffers`), or on a device
  // (`on_device`, defined only then, wrapped with the stream of that update, so that copies of it
  // wait for that update). They move only inside an update of that index.
  struct IndexState {
    uint64_t update_count = 0;
    size_t length = 0;
    std::vector<float> buffers;  // state_buffers_ * length, while on the host
    Array on_device;             // state_buffers_ * length float32, while on a device
  };
  using StateTable = std::unordered_map<uint64_t, IndexState>;

  // The state of `index`, created for `n` elements by the first call; throws for another length.
  IndexState& StateOf(uint64_t index, size_t n);
  [[noreturn]] void BadState(const std::string& why) const;
  // "optimizer 'sgd': index 3", for errors about one index.
  std::string IndexName(uint64_t index) const;
  // Throws InvalidArgument, naming the index, for weights and gradients of different lengths.
  void CheckLengths(uint64_t index, size_t weights, size_t grads) const;
  // `state`'s buffers on the host, copied back from a device if they were there.
  float* HostBuffers(IndexState& state);
  // `state`'s buffers on `device` (copied there if they were elsewhere), for an update queued on
  // `stream`; null when the rule keeps none.
  float* DeviceBuffers(IndexState& state, int device, void* stream);

  const OptimizerSpec spec_;
  const std::string state_name_;
  // The base rate for update number t: the last change at or before t, else learning_rate_.
  double BaseRateAt(uint64_t t) const;

  const OptimizerParams params_;  // reads spec_
  // The base rate and set_learning_rate_from's changes, (t, rate) in increasing order of t.
  mutable std::mutex rate_mutex_;
  double learning_rate_ = 0;
  std::vector<std::pair<uint64_t, double>> rate_changes_;
  LearningRateSchedule schedule_;
  bool lazy_update_ = true;
  size_t state_buffers_ = 0;

  ParallelFor parallel_for_;        // unset: updates run on the caller's thread
  mutable std::mutex state_mutex_;  // guards the table only, not the buffers in it
  StateTable state_;
};

}  // namespace dtrain

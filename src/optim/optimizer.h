// The optimizer inside the project: the update rule applied to a weight given its gradient, built
// from the public OptimizerSpec (dtrain/optim/optimizer.h) by CreateOptimizer.
//
// The same code runs on servers (update_on_kvstore: the servers apply it to each merged gradient)
// and on workers (the worker pulls the merged gradient and updates locally), so both give identical
// results. An optimizer keeps its state (momentum, ..., and the number of updates so far) per
// `index`: a key on a worker, a key and part on a server, which owns only some parts of a big
// array. All rules here are element-wise, so updating parts separately equals updating the whole.
//
// Optimizers (CreateOptimizer's names; parameters and formulas in each one's header):
//   sgd      SGD, with momentum and Nesterov momentum (rules/sgd.h); "nag" is SGD with nesterov = 1
//   adam     Adam with MXNet's bias correction through the learning rate (rules/adam.h)
//   adagrad  AdaGrad (rules/adagrad.h)
//   rmsprop  RMSProp, plain (Tieleman & Hinton) or centered (Graves) (rules/rmsprop.h)
// Every one takes a learning-rate schedule (lr_schedule.h): OptimizerSpec::lr_scheduler and the
// "lr_*" parameters.
//
// Update count: each index counts its own updates. Its first Update is update t = 1, as MXNet
// counts (it increments the count before it asks the schedule, and Adam uses that count). A server
// updates every slot of a key once per round, so the counts agree with a worker's for the key.
//
// Threads: Update may be called concurrently for different indexes, never for the same one.
// SaveState, LoadState and UpdateCount must not run while an Update does (the caller pauses
// updates, as a checkpoint does); learning_rate and set_learning_rate may be called any time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "dtrain/common/array.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // weight -= f(grad, state[index]); grad and weight have the same length. The state of an index
  // is created (zeros, update count 0) by its first Update and keeps that length. Throws
  // InvalidArgument for lengths that differ, from each other or from the index's earlier updates;
  // a refused Update changes nothing.
  virtual void Update(uint64_t index, std::span<float> weight, std::span<const float> grad) = 0;

  // MXNet's lazy update of a row-sparse gradient: `weight` is the index's whole value, a matrix
  // of rows of `row_length` elements; `grad` holds the gradient of the rows `rows` (strictly
  // increasing, each below the matrix's row count), one after another. Only those rows' weights
  // and state change, each as Update would change it (so weight decay and momentum reach a row
  // only in the steps that touch it); the index's update count goes up by one, as for any update.
  // The state is the whole index's, shared with Update. Throws InvalidArgument for a row length
  // that does not divide the weight, rows out of order or range, a gradient of another length, or
  // a length other than the index's earlier updates'; a refused call changes nothing.
  virtual void UpdateRows(uint64_t index, std::span<float> weight, size_t row_length,
                          std::span<const int64_t> rows, std::span<const float> grad) = 0;

  // Whether a store applies a row-sparse gradient with UpdateRows (MXNet's lazy_update, the
  // spec's "lazy_update" parameter, 1 by default as in MXNet) or as a dense gradient, zero in the
  // rows not pushed, with Update (lazy_update 0: weight decay and momentum reach every row).
  virtual bool lazy_update() const = 0;

  // The same update on float32 values in one CUDA device's memory (device Arrays, as the front
  // ends wrap CUDA tensors), computed there bit for bit as Update computes it. The kernel is queued
  // on `weight`'s stream, after the work queued so far on `grad`'s, and the call returns without
  // waiting for it: work queued later on that stream sees the new weights. The index's state
  // moves to that device with its first such update (and back to the host with a later Update),
  // so an index may switch between the two; SaveState copies it from wherever it is. Throws
  // InvalidArgument for host arrays, arrays on different devices, another dtype, or lengths as
  // Update does, and in a build without CUDA.
  virtual void UpdateOnDevice(uint64_t index, const Array& weight, const Array& grad) = 0;

  // The spec this optimizer was built from (a later set_learning_rate does not change it).
  virtual const OptimizerSpec& spec() const = 0;

  // The base learning rate: the spec's "learning_rate" until set_learning_rate changes it. Without
  // a schedule every Update uses it; a schedule scales it by the index's update count
  // (LearningRateAt). May be called from any thread, also while Update runs (that Update uses the
  // old or the new rate). set_learning_rate throws InvalidArgument for a negative or non-finite
  // rate.
  virtual void set_learning_rate(double learning_rate) = 0;
  virtual double learning_rate() const = 0;
  // From each index's update number `t` on (1 for its first), updates use the base rate
  // `learning_rate`; updates numbered below `t` keep the rate they had. This is how a store that
  // runs the optimizer for a whole job changes the rate between two steps: every key's update of
  // step t takes the new rate whenever it runs, where set_learning_rate reaches whatever update
  // runs next. A call replaces the changes an earlier one made from `t` on; set_learning_rate
  // drops them all. learning_rate() is the rate of the last change. Throws InvalidArgument for
  // t = 0, t > 2^53, or a rate set_learning_rate refuses.
  virtual void set_learning_rate_from(uint64_t t, double learning_rate) = 0;

  // The learning rate that an index's update number `t` (1 for its first) uses with the current
  // base rate: learning_rate() itself when there is no schedule. Adam's bias correction is not
  // included (it is part of Adam's rule).
  virtual double LearningRateAt(uint64_t t) const = 0;

  // How many updates `index` has had (0 for an index never updated).
  virtual uint64_t UpdateCount(uint64_t index) const = 0;

  // The state of every index (update count and buffers) and the base learning rate, in a
  // versioned binary form that names the optimizer. LoadState replaces this optimizer's state and
  // base learning rate with it: an optimizer built from the same spec then continues bit for bit
  // as the saved one would have. The bytes may come from anywhere: anything that is not such a
  // state for this optimizer (another optimizer or variant, another version, cut short, extra
  // bytes, inconsistent lengths) is an InvalidArgument and leaves this optimizer as it was.
  virtual std::string SaveState() const = 0;
  virtual void LoadState(const std::string& bytes) = 0;

  // How a big Update may be split over threads: parallel_for(n, fn) runs fn(begin, end) over
  // pieces covering [0, n) (on several threads, or as fn(0, n)) and returns once all are done.
  // Updates are element-wise, so splitting changes no result. Set before the updates start (a
  // server hands its reduction threads here); unset, an Update runs on its caller's thread.
  using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t, int64_t)>&)>;
  virtual void SetParallelFor(ParallelFor parallel_for) = 0;
};

// Builds an optimizer by name (case-insensitive: "sgd", "nag", "adam", "adagrad", "rmsprop").
// Throws InvalidArgument for an unknown name, parameter or schedule, or a bad value, naming it and
// what is accepted.
std::unique_ptr<Optimizer> CreateOptimizer(const OptimizerSpec& spec);

}  // namespace dtrain

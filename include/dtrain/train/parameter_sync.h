// ParameterSync: keeps a model's parameters identical on every worker through a KVStore, as
// Gluon's Trainer does. It is the engine under both the C++ Trainer (trainer.h) and Python's
// dtrain.torch.Trainer, which hand it the parameter tensors of their networks.
//
//   ParameterSync sync({replica0_params, replica1_params}, names, kv, options);
//   for (...) { each replica: loss.backward(); sync.Step(batch); before forward: sync.WaitFor(i); }
//
// Every big parameter is a KVStore key of its own; small ones are fused into buckets (keys
// numbered in backward order, the same on every worker). At construction rank 0's initial
// weights become everyone's (Init keeps rank 0's values, then every worker pulls).
//
// Communication overlaps computation: each parameter's gradient is pushed as soon as backward has
// produced it on every local replica (autograd hooks on the parameter tensors), and the caller
// waits, parameter by parameter, only for the weights it is about to use (WaitFor). Gradients are
// summed over replicas (by the store) and workers (by the servers), then rescaled by
// 1/(batch_size * num_workers) in dist_sync (the mean over the global batch, so N workers with
// batch b match one worker with batch N*b) or 1/batch_size otherwise; losses are expected with
// sum reduction, as in Gluon.
//
// update_on_kvstore: the store applies the optimizer (on the servers for dist stores) and the
// weights are pulled; otherwise the summed gradient is pulled and the same optimizer code runs
// here. Both give identical results.
//
// Batch size: known in advance (options.batch_size > 0), gradients leave during the first
// backward already. With batch_size 0 it is learnt from the first Step (as Gluon learns it from
// trainer.step): the optimizer is set up then, so the first step's gradients leave at Step and
// overlap starts with the second step. Every later Step must give the same size.
//
// float16 and bfloat16 parameters train as MXNet's multi_precision: their gradients travel as
// float32, the optimizer updates float32 master weights (in the store, or here), and each
// parameter gets them rounded to its dtype. The store's keys hold the masters; a saved model
// holds the rounded parameters, so a resumed job's masters start from those.
//
// CUDA parameters: gradients and weights travel as device Arrays ordered after torch's current
// stream (through an event; docs/design.md, "GPUs"), fused buckets live on the parameters' GPU,
// and an optimizer run here (update_on_kvstore false) updates replica 0's weights on their GPU,
// queued on torch's current stream (the host's results bit for bit), then copies them to the
// other replicas.
//
// Sparse gradients (an embedding's with sparse(true)): with a dist store applying the optimizer
// (update_on_kvstore), a host matrix with a key of its own travels as rows, MXNet's row_sparse:
// a step pushes only the rows its batches touched (KVStore::PushRows), the servers update only
// those (MXNet's lazy_update, unless the optimizer's lazy_update is 0), and WaitForRows pulls
// only the rows the next forward reads; the other rows here stay as they were until WaitFor,
// WaitAll or PullLatest pulls the whole table (before evaluating or saving). Elsewhere (a local
// store, the optimizer here, a fused or CUDA parameter) sparse gradients travel dense, as
// Horovod's sparse_as_dense.
//
// Errors: Step, WaitFor and WaitAll throw what an exchange failed with (PeerError naming the node,
// TimeoutError); a failure met inside an autograd hook is kept and thrown by the next of them,
// never into autograd.
//
// Threads: call everything from the training thread; hooks run on autograd's threads.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/kvstore/kvstore.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain {
class Optimizer;  // the project's own (the spec, OptimizerSpec, is what users give)
}  // namespace dtrain

namespace dtrain::train {

struct TrainerOptions {
  OptimizerSpec optimizer{"sgd", {{"learning_rate", 0.01}}};
  // Per-worker batch size of every step (the sum of the replicas' parts); 0: learnt from the
  // first Step (see above).
  int64_t batch_size = 0;
  bool update_on_kvstore = true;
  bool overlap = true;
  // Tensor fusion: parameters smaller than this travel together, in buckets of up to
  // bucket_bytes, as one key each (a LeNet step is then 2 exchanges instead of 10). Updates are
  // element-wise, so fusing changes no result. 0 turns fusion off. With gradient compression that
  // spares keys under min_elements (set on the store before the trainer is made), only parameters
  // it spares are fused, in buckets it spares too.
  int64_t fuse_below_bytes = 64 * 1024;
  int64_t bucket_bytes = 4 << 20;
  // Gradient accumulation (Horovod's name): the backward passes whose gradients a step sums. A
  // parameter's gradient leaves once its last pass has produced it; a step after fewer passes
  // sends what came. A pass beyond them is an error at the next Step or wait, never ignored.
  int backward_passes_per_step = 1;
};

// The front ends' update_on_kvstore when the user leaves it unset: true (the servers update for
// dist stores, the collectives' store for horovod), except for a local store ("local", "device")
// with CUDA parameters, where the optimizer runs here, on the GPU, as Gluon's Trainer updates on
// the device for a single-machine store.
bool DefaultUpdateOnKVStore(const std::string& store_type, bool cuda_parameters);

class ParameterSync {
 public:
  // `replicas[r][i]` is parameter i on local replica r: every replica lists the same shapes in the
  // same order, which must be the same on every worker; float32, float16 or bfloat16, contiguous,
  // on the CPU or a CUDA device (replicas may sit on different GPUs: the store sums their
  // gradients, on the GPU for the *_device types). Replica 0's values are copied into the others.
  // Throws InvalidArgument for bad options (dist_async without update_on_kvstore, a negative batch
  // size, an unknown optimizer), other dtypes, or replicas that differ.
  ParameterSync(std::vector<std::vector<torch::Tensor>> replicas, KVStore& kv,
                TrainerOptions options);
  // Waits for the exchanges in flight (their errors are logged, not thrown).
  ~ParameterSync();

  ParameterSync(const ParameterSync&) = delete;
  ParameterSync& operator=(const ParameterSync&) = delete;

  // Ends a step: makes sure every gradient has been sent (sending the ones backward did not
  // produce as zeros), and, without overlap, waits for the new weights. Clears the parameters'
  // .grad (each backward writes them afresh, Gluon's grad_req "write"). Throws InvalidArgument
  // for a batch size other than the declared (or first) one.
  void Step(int64_t batch_size);

  // The (parameter index, replica) pairs whose gradient no backward pass has produced since the
  // last Step: parameters the forward did not use. Step sends zeros for them. Gluon's Trainer
  // refuses such a step unless told to ignore stale gradients; the Python Trainer asks this.
  std::vector<std::pair<size_t, size_t>> StaleGradients() const;

  // Waits until parameter `index` holds its latest weights on every replica.
  void WaitFor(size_t index);
  void WaitFor(std::span<const size_t> indexes);
  // Waits until rows `ids` (any integer tensor, repeats allowed) of parameter `index` hold their
  // latest weights on every replica: what an embedding's forward reads. For a table trained by
  // rows (see "Sparse gradients" above) only those rows travel; otherwise it is WaitFor(index).
  // Throws InvalidArgument for an id outside the table.
  void WaitForRows(size_t index, const torch::Tensor& ids);
  // Waits until every parameter of every replica holds the latest weights.
  void WaitAll();
  // WaitAll, then pulls every key's value from the store into every replica: with dist_async,
  // after a barrier, the job's weights after every worker's last push (this worker's copy misses
  // the pushes the others made after its last pull).
  void PullLatest();

  // The base learning rate. Setting it between two steps changes it from the next step on,
  // wherever the optimizer runs: here, or in the store (every key's update of the next step, on
  // every server: KVStore::SetLearningRate, which the servers take from rank 0). Call it on every
  // worker alike, as a training script does.
  double learning_rate() const;
  void set_learning_rate(double lr);

  // The optimizer's state: the local one's, or the store's (fetched from every server for dist
  // stores; call on rank 0), as opaque bytes whose first byte says which.
  std::string SaveOptimizerState();
  // Restores SaveOptimizerState's bytes. With the store running the optimizer rank 0 restores it
  // on the servers and every worker waits for that (call on every worker). Throws
  // InvalidArgument for a state of another optimizer, layout or side (local vs store). Before the
  // first step of a trainer that learns its batch size there, the state is kept and restored
  // when that step sets the optimizer up.
  void LoadOptimizerState(const std::string& bytes);

  // Copies replica 0's values into the other replicas (after loading a checkpoint into it).
  void ReplicateFromFirst();

  int64_t num_parameters() const { return static_cast<int64_t>(params_.size()); }
  // Keys the parameters travel under (one per bucket).
  int64_t num_keys() const { return static_cast<int64_t>(buckets_.size()); }
  int64_t batch_size() const { return options_.batch_size; }
  bool update_on_kvstore() const { return options_.update_on_kvstore; }

 private:
  struct Param;
  struct Bucket;

  void PlanBuckets();
  // Builds the optimizer for `batch_size` (rescale) and installs it here or in the store.
  void SetUpOptimizer(int64_t batch_size);
  // The store's optimizer takes `lr` from the next step on (set_learning_rate).
  void SetStoreLearningRate(double lr);
  void OnGradient(size_t index, int replica, const torch::Tensor& grad);
  void TakeGradient(size_t index, int replica, const torch::Tensor& grad,
                    std::unique_lock<std::mutex>& lock);
  void ThrowIfHookFailed();  // mutex_ held
  void Issue(Bucket& b, std::unique_lock<std::mutex>& lock);
  // `timed`: the wait counts as waiting for communication (not in WaitAll).
  void Finish(Bucket& b, std::unique_lock<std::mutex>& lock, bool timed = true);
  Operation StartPull(const Bucket& b);  // b's value from the store into every replica
  void PullWeights();                    // every key's value from the store into every replica
  // Rows (the row-sparse exchange). Keeps `grad` for a push of rows and returns true, or returns
  // false (it travels dense).
  bool KeepSparseGradient(Param& p, int replica, const torch::Tensor& grad);
  bool TravelsAsRows(const Param& p) const;  // this step's exchange of p, at Issue
  void IssueRows(Bucket& b, std::unique_lock<std::mutex>& lock);
  // Pulls p's whole value if its rows are stale (after the bucket's Finish).
  void PullIfRowsStale(Param& p, std::unique_lock<std::mutex>& lock);
  void Scatter(const Bucket& b);  // a flat bucket's weights into every replica
  void Gather(const Bucket& b);   // replica 0's weights into a flat bucket's weights

  // Progress records for the launcher (steps, samples, time waiting for communication, rates): at
  // most one a second, and a summary at the end.
  // mutex_ held (WaitFor adds to wait_s_ under it).
  void ReportProgress(bool final);

  KVStore& kv_;
  TrainerOptions options_;
  // Progress. Steps are timed end to end; a step that follows a WaitAll (the caller evaluated or
  // saved in between) is counted but not timed. wait_s_: time blocked in Step and WaitFor for
  // exchanges, within timed steps. Then the totals at the last report.
  int64_t steps_ = 0;
  int64_t samples_ = 0;
  int64_t timed_steps_ = 0;
  int64_t timed_samples_ = 0;
  double active_s_ = 0;
  double wait_s_ = 0;
  bool paused_ = true;  // no step yet, or a WaitAll since the last one
  std::chrono::steady_clock::time_point last_step_end_{};
  std::chrono::steady_clock::time_point last_report_{};
  int64_t reported_steps_ = 0;
  int64_t reported_samples_ = 0;
  double reported_active_s_ = 0;
  bool sync_ = true;
  bool optimizer_ready_ = false;  // the optimizer is set up (the batch size is known)
  double pending_learning_rate_ = -1;
  std::string pending_state_;      // LoadOptimizerState before the optimizer was set up
  std::exception_ptr hook_error_;  // the first failure inside an autograd hook
  std::unique_ptr<Optimizer> local_optimizer_;  // when !update_on_kvstore
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  size_t num_replicas_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace dtrain::train

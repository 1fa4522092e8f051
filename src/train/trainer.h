// Trainer: Gluon's Trainer over a KVStore, for LibTorch networks.
//
//   Trainer trainer(replicas, *kv, {{"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}}, 64});
//   for (...) { for each replica r: loss_r.backward(); trainer.Step(64); }
//
// Every big parameter is a KVStore key of its own; small ones are fused into buckets (keys numbered
// in backward order, the same on every worker). At construction rank 0's initial weights become
// everyone's (Init keeps rank 0's values, then every worker pulls).
//
// Communication overlaps computation: each parameter's gradient is pushed as soon as backward has
// produced it on every local replica (autograd hooks), and the next forward waits, layer by layer,
// only for the weights that layer uses (Network gates). Gradients are summed over replicas (by the
// store) and workers (by the servers), then rescaled by 1/(batch_size * num_workers) in dist_sync
// (the mean over the global batch, so N workers with batch b match one worker with batch N*b) or
// 1/batch_size otherwise; losses are expected with sum reduction, as in Gluon.
//
// update_on_kvstore: the store applies the optimizer (on the servers for dist stores) and the
// trainer pulls weights; otherwise it pulls the summed gradient and applies the same optimizer
// code locally. Both give identical results.
//
// Threads: call everything from the training thread; backward may run on autograd's threads.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvstore/kvstore.h"
#include "optim/optimizer.h"
#include "train/models/network.h"

namespace dtrain::train {

struct TrainerOptions {
  OptimizerSpec optimizer{"sgd", {{"learning_rate", 0.01}}};
  // Per-worker batch size of every step (the sum of the replicas' parts); with overlap the
  // gradients leave before Step() is called, so it must be known in advance.
  int64_t batch_size = 0;
  bool update_on_kvstore = true;
  bool overlap = true;
  // Tensor fusion: parameters smaller than this travel together, in buckets of up to
  // bucket_bytes, as one key each (a LeNet step is then 2 exchanges instead of 10). Updates are
  // element-wise, so fusing changes no result. 0 turns fusion off.
  int64_t fuse_below_bytes = 64 * 1024;
  int64_t bucket_bytes = 4 << 20;
};

class Trainer {
 public:
  // `replicas`: the same network once per local device; replica 0's parameters are copied into
  // the others. Throws InvalidArgument for bad options (dist_async without update_on_kvstore,
  // batch_size < 1, replicas with different parameters).
  Trainer(std::vector<std::shared_ptr<Network>> replicas, KVStore& kv, TrainerOptions options);
  ~Trainer();

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Ends a step: makes sure every gradient has been sent (sending the ones backward did not
  // produce as zeros), and, without overlap, waits for the new weights. batch_size must be the
  // declared one.
  void Step(int64_t batch_size);

  // Waits until every parameter of every replica holds the latest weights.
  void WaitAll();

  double learning_rate() const;
  void set_learning_rate(double lr);

  // Model parameters and buffers (replica 0) and the optimizer's state (the local one, or the
  // store's: fetched from every server for dist stores; call on rank 0). To resume,
  // load the parameters into the network before constructing the Trainer (rank 0's then become
  // everyone's), then call LoadOptimizerState.
  void Save(const std::string& path);
  void Load(const std::string& path);
  // Restores the optimizer's state saved by Save (a no-op if the file holds none); with the store
  // running the optimizer, rank 0 restores it on the servers and every worker waits for that
  // (call on every worker). Throws InvalidArgument for a state of another optimizer or layout.
  void LoadOptimizerState(const std::string& path);

  int64_t num_parameters() const { return static_cast<int64_t>(params_.size()); }
  // Keys the parameters travel under (one per bucket).
  int64_t num_keys() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Param;
  struct Bucket;

  void PlanBuckets();
  void OnGradient(size_t index, int replica, const torch::Tensor& grad);
  void Issue(Bucket& b, std::unique_lock<std::mutex>& lock);
  void Finish(Bucket& b, std::unique_lock<std::mutex>& lock);
  void Scatter(const Bucket& b);  // a fused bucket's flat weights into every replica
  void GateModule(int replica, torch::nn::Module& module);
  void ReplicateFromFirst();

  std::vector<std::shared_ptr<Network>> replicas_;
  KVStore& kv_;
  TrainerOptions options_;
  bool sync_;
  std::unique_ptr<Optimizer> local_optimizer_;  // when !update_on_kvstore
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::unordered_map<const void*, size_t>> index_of_;  // per replica: tensor -> param
  mutable std::mutex mutex_;
};

}  // namespace dtrain::train

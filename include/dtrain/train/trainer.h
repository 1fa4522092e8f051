// Trainer: Gluon's Trainer over a KVStore, for LibTorch networks.
//
//   Trainer trainer(replicas, *kv, {{"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}}, 64});
//   for (...) { for each replica r: loss_r.backward(); trainer.Step(64); }
//
// The parameters are kept in sync by a ParameterSync (parameter_sync.h: keys, fusion, rank 0's
// initial weights, overlap, update_on_kvstore, rescaling). The Trainer adds what LibTorch
// networks need around it: it installs the networks' gates so that the next forward waits, layer
// by layer, only for the weights that layer uses, replicates buffers (batch-norm statistics) from
// replica 0, and saves and loads checkpoints.
//
// Threads: call everything from the training thread; backward may run on autograd's threads.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtrain/kvstore/kvstore.h"
#include "dtrain/train/models/network.h"
#include "dtrain/train/parameter_sync.h"

namespace dtrain::train {

// Copies a checkpoint's parameters and buffers (Trainer::Save's) into `module`'s own tensors, on
// whatever device they are. Throws c10::Error for a missing key or a shape that differs.
void LoadInto(torch::serialize::InputArchive& archive, torch::nn::Module& module);

class Trainer {
 public:
  // `replicas`: the same network once per local device; replica 0's parameters are copied into
  // the others. Throws InvalidArgument for bad options (dist_async without update_on_kvstore,
  // batch_size < 1: a LibTorch program knows it in advance, replicas with different parameters).
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
  // WaitAll, then pulls the store's current weights into every replica (ParameterSync's).
  void PullLatest();

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
  // The optimizer's state as Save keeps it, in memory (waits for every exchange), and back: for
  // elastic jobs' commits (elastic.h). RestoreOptimizerState has LoadOptimizerState's rules.
  std::string OptimizerState() { return sync_->SaveOptimizerState(); }
  void RestoreOptimizerState(const std::string& bytes) { sync_->LoadOptimizerState(bytes); }

  int64_t num_parameters() const { return sync_->num_parameters(); }
  // Keys the parameters travel under (one per bucket).
  int64_t num_keys() const { return sync_->num_keys(); }

 private:
  void GateModule(int replica, torch::nn::Module& module);
  void ReplicateBuffers();

  std::vector<std::shared_ptr<Network>> replicas_;
  KVStore& kv_;
  std::unique_ptr<ParameterSync> sync_;
  std::vector<std::unordered_map<const void*, size_t>> index_of_;  // per replica: tensor -> param
};

}  // namespace dtrain::train

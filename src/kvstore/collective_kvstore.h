// CollectiveKVStore: the "horovod" KVStore type. Workers sum pushes among themselves with
// allreduce (src/collectives) instead of sending them to parameter servers, so a program written
// for dist_sync (the Trainer, dtrain-train) runs in allreduce mode unchanged.
//
// Semantics are dist_sync's, without servers:
//   - Init broadcasts rank 0's value: every worker starts from the same weights;
//   - Push sums the key's local arrays, then allreduces the sum over the workers (the collective
//     is named after the key, so workers may push keys in different orders); with an optimizer
//     set, each worker then applies it to its own copy of the weight. Every worker runs the same
//     update on the same summed gradient from the same start, so the copies stay identical, as
//     the single copy on a server would;
//   - Pull copies the key's value once this worker's pushes of it are applied.
// Optimizer state: SaveOptimizerState returns this worker's, the same on every worker. A state
// loaded on rank 0 reaches the others at the next Barrier (the Trainer's resume does both).
//
// Completion: pushes are asynchronous. The allreduce runs on the collectives engine's thread,
// which then applies the sum (collectives::Handle::OnDone) and completes the Operation. A pull
// waits for the key's last push. A failed collective (a dead rank, a deadline) fails the
// operation with the engine's error.
//
// Threads: any method from any thread; calls on one key take turns.
#pragma once

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config/config.h"
#include "dtrain/collectives/collectives.h"
#include "dtrain/kvstore/kvstore.h"
#include "optim/optimizer.h"

namespace dtrain {

class CollectiveKVStore final : public KVStore {
 public:
  // Starts the collectives (collectives::Init) if not already. Throws ConfigError for a bad
  // environment, PeerError/TimeoutError when the rendezvous fails.
  explicit CollectiveKVStore(const Config& config);
  ~CollectiveKVStore() override;

  std::string type() const override { return "horovod"; }
  int rank() const override;
  int num_workers() const override;

  using KVStore::Init;
  using KVStore::Pull;
  using KVStore::Push;
  using KVStore::PushPull;

  void Init(Key key, const Array& value) override;
  Operation Push(Key key, std::vector<Array> values, int priority = 0) override;
  Operation Pull(Key key, std::vector<Array> outs, int priority = 0) override;
  Operation PushPull(Key key, std::vector<Array> values, std::vector<Array> outs,
                     int priority = 0) override;

  void WaitAll() override;
  void Barrier() override;

  void SetOptimizer(const OptimizerSpec& spec) override;
  // Refused: allreduce mode compresses with DTRAIN_FP16_ALLREDUCE instead.
  void SetGradientCompression(const std::map<std::string, std::string>& params) override;
  std::string SaveOptimizerState() override;
  void LoadOptimizerState(const std::string& state) override;
  void SetLearningRate(double learning_rate, uint64_t from_update) override;

 private:
  struct Slot;

  Slot& Find(Key key, const char* call) const;
  // Allreduces the local sum of `values`; when it is in, applies it and copies the key's value
  // into `outs` (on the engine's thread), then completes the returned operation. `priority` orders
  // the allreduce among those ready (collectives.h).
  Operation StartPush(Key key, Slot& slot, const std::vector<Array>& values,
                      std::vector<Array> outs, const char* call, int priority);
  void ShareLoadedOptimizerState();

  const Duration timeout_;
  mutable std::shared_mutex mutex_;  // the table and the optimizer pointer
  std::unordered_map<Key, std::unique_ptr<Slot>> slots_;
  std::shared_ptr<Optimizer> optimizer_;
  std::string loaded_state_;  // rank 0: restored since the last Barrier, for the others
};

}  // namespace dtrain

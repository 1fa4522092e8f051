// Horovod's elastic mode (hvd.elastic.run, TorchState) for the C++ Trainer, through its "horovod"
// KVStore:
//
//   ElasticState state(replicas);
//   RunElastic(state, [&](KVStore& kv) { return std::make_unique<Trainer>(replicas, kv, opts); },
//              [&](Trainer& trainer, KVStore& kv, ElasticState& state) {
//                for (; state.epoch < epochs; ++state.epoch, state.samples_done = 0) {
//                  while (/* the epoch has a global batch left */) {
//                    /* forward, backward on this rank's share */ trainer.Step(batch);
//                    state.samples_done += batch * kv.num_workers();
//                    if (++state.steps % 50 == 0) state.Commit();
//                  }
//                  state.Commit();
//                }
//              });
//
// started with `dtrain launch -s 0 --host-discovery-script S --min-np A --max-np B -- prog`.
// Every membership of the job gets a new store (which joins it: collectives::Init) and a Trainer
// from the factory; before `train` runs, every rank takes rank 0's committed state (the network's
// parameters and buffers, the optimizer's state, the position), as Horovod's sync() does.
//
//   - A worker dies: the others' Step or WaitAll throws PeerError or TimeoutError. RunElastic rolls
//     the state back to its last Commit (the launcher is told how many steps that redoes), joins
//     the next membership and calls `train` again; the survivors redo the steps since the commit.
//   - Workers are added: every rank's Commit throws HostsUpdatedInterrupt at the same commit (rank
//     0 asks the launcher, every rank gets its answer) and the members form a membership with the
//     newcomers. When workers only left, the members' committed states are equal: the next
//     membership skips the sync.
//   - The launcher removes this worker (its host left the script's output): RemovedFromJob
//     (collectives.h) leaves RunElastic; the program should exit 0.
//
// The position is the job's, not the rank's: `samples_done` counts the epoch's samples the whole
// job has taken, in one order every rank knows (rank r takes positions [samples_done + r*batch,
// + batch) of each global batch), so it survives a change of size with nothing to gather.
//
// Outside an elastic job, RunElastic makes one store and one Trainer and calls `train` once;
// Commit keeps nothing (nothing can be rolled back).
//
// Threads: the training thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/kvstore/kvstore.h"
#include "dtrain/train/models/network.h"
#include "dtrain/train/trainer.h"

namespace dtrain::train {

// Thrown by ElasticState::Commit on every rank at once when workers came or went since the
// membership formed. Not a dtrain::Error: a `catch (const dtrain::Error&)` in the training
// function must not swallow it. skip_sync(): workers only left.
class HostsUpdatedInterrupt : public std::exception {
 public:
  explicit HostsUpdatedInterrupt(bool skip_sync) : skip_sync_(skip_sync) {}
  const char* what() const noexcept override {
    return "the elastic job's workers changed: forming a new membership";
  }
  bool skip_sync() const { return skip_sync_; }

 private:
  bool skip_sync_;
};

class ElasticState {
 public:
  // `replicas`: the networks the Trainer trains (replica 0's parameters and buffers are kept).
  // Their present values are the first commit.
  explicit ElasticState(std::vector<std::shared_ptr<Network>> replicas);

  // The job's position, kept and restored with the rest.
  int64_t epoch = 0;
  int64_t samples_done = 0;  // of this epoch, by every rank together
  int64_t steps = 0;         // Trainer steps of the job

  // Keeps the state (waits for the Trainer's exchanges), then, in an elastic job, throws
  // HostsUpdatedInterrupt on every rank when workers came or went. Call on every rank at the
  // same step, inside RunElastic's `train`.
  void Commit();

 private:
  friend void RunElastic(ElasticState&, const std::function<std::unique_ptr<Trainer>(KVStore&)>&,
                         const std::function<void(Trainer&, KVStore&, ElasticState&)>&);
  struct Saved {
    int64_t epoch = 0, samples_done = 0, steps = 0;
    std::vector<torch::Tensor> tensors;  // replica 0's parameters, then buffers, on the CPU
    std::string optimizer;               // the Trainer's state; empty before the first Trainer
  };

  void Save();
  void Restore();
  void Sync();  // rank 0's saved state into everyone's
  void CheckHostUpdates();
  std::vector<torch::Tensor> Live() const;  // replica 0's parameters, then buffers

  std::vector<std::shared_ptr<Network>> replicas_;
  Trainer* trainer_ = nullptr;  // while `train` runs
  Saved saved_;
};

using TrainerFactory = std::function<std::unique_ptr<Trainer>(KVStore&)>;
using ElasticTraining = std::function<void(Trainer&, KVStore&, ElasticState&)>;

// Horovod's hvd.elastic.run for the Trainer (above). Throws what `train` throws other than a
// failed collective, RemovedFromJob, and the last error when a membership could not be formed in
// 5 tries.
void RunElastic(ElasticState& state, const TrainerFactory& make_trainer,
                const ElasticTraining& train);

}  // namespace dtrain::train

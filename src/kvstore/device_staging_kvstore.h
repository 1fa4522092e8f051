// DeviceStagingKVStore: CUDA arrays through any KVStore, as MXNet moves GPU NDArrays.
//
// Wraps the store KVStore::Create made. Calls whose arrays are all on the host go straight
// through. Device arrays are staged through pinned host memory (src/cuda):
//   - push: for "device", "dist_sync_device" and "dist_async_device" with several device values and
//     no gradient compression, the values are summed on the first value's GPU (peer copies for
//     values on other GPUs) and only that sum is staged, once per key, as MXNet's *_device stores
//     aggregate on the GPU before the network; otherwise (MXNet's "local" and "dist_sync" stage
//     every device's value through the CPU) each value is staged and the wrapped store sums them.
//     The wrapped store then does exactly what it does for host values, so results equal the
//     host path's (float sums on the GPU are plain rounded adds, in the same order).
//   - pull: into one pinned host array, copied to every device output once the wrapped pull is
//     done (on the thread that finished it), before the returned Operation is done.
// Copies are ordered after the work queued on each array's stream (cuda.h).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/kvstore/kvstore.h"

namespace dtrain {

class DeviceStagingKVStore final : public KVStore {
 public:
  explicit DeviceStagingKVStore(std::unique_ptr<KVStore> inner);

  std::string type() const override { return inner_->type(); }
  int rank() const override { return inner_->rank(); }
  int num_workers() const override { return inner_->num_workers(); }
  int64_t rounds_done() const override { return inner_->rounds_done(); }
  bool rejoined() const override { return inner_->rejoined(); }

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
  void Barrier() override { inner_->Barrier(); }
  void SetOptimizer(const OptimizerSpec& spec) override { inner_->SetOptimizer(spec); }
  void SetGradientCompression(const std::map<std::string, std::string>& params) override {
    inner_->SetGradientCompression(params);
  }
  CompressionSpec gradient_compression() const override { return inner_->gradient_compression(); }
  std::string SaveOptimizerState() override { return inner_->SaveOptimizerState(); }
  void LoadOptimizerState(const std::string& state) override { inner_->LoadOptimizerState(state); }

 private:
  // Host arrays to hand the wrapped store in place of `values`.
  std::vector<Array> StageValues(const std::vector<Array>& values) const;
  // Runs `call` (the wrapped store's pull or pushpull) on host stand-ins for `outs`; where some are
  // on a device, the returned operation also copies the pulled value to them, once the wrapped one
  // is done (on the thread that finished it).
  Operation IntoOutputs(Key key, std::vector<Array> outs,
                        const std::function<Operation(std::vector<Array> hosts)>& call);

  const std::unique_ptr<KVStore> inner_;
  const bool aggregate_on_device_;  // "device" and "dist_*_device"
  std::mutex mutex_;
  std::vector<Operation> copying_back_;  // pulls whose device copies may not have run yet
};

}  // namespace dtrain

// LocalKVStore: the "local" and "device" KVStore types, which aggregate inside one process.
//
// A push sums the arrays given for a key (one per device) on the CPU. With an optimizer set, the
// optimizer then updates the stored weight with that sum (its index is the key); without one the
// stored value becomes the sum, as MXNet's default local updater assigns the merged value. A pull
// copies the stored value into every array given.
//
// Values in GPU memory (CUDA builds; DeviceStagingKVStore passes them on where UpdatesOnDevice
// says so, and stages every other call through the host): a push of device values to "device" is
// summed on the first one's GPU, and a single one to "local" is taken as it is (float32 ones where
// an optimizer is in place; without gradient compression between several), as MXNet's local
// stores do. Without an optimizer that sum becomes the key's value, on its GPU; with one, the
// key's weight moves to that GPU, with the optimizer's state, and the update runs there
// (Optimizer::UpdateOnDevice, bit for bit as on the host). A later push of host values moves the
// key back. A pull copies the value wherever its outputs are: into device outputs on the GPU,
// queued after their streams' work and before their streams' later work, without waiting. The
// rest of the time the store works on the host.
//
// Completion: every call has finished when it returns, so the Operation returned is already done
// (in one process there is no communication to overlap); work queued on a GPU is ordered by its
// streams instead. An invalid call (unknown key, wrong
// length or dtype, no arrays, a key initialised twice) throws InvalidArgument naming the key and
// changes nothing.
//
// Threads: any method may be called from any thread. Calls on different keys run in parallel
// (the optimizer is built for that); calls on one key take turns, so a pull sees a push and its
// optimizer update either entirely or not at all. Saving or loading the optimizer's state waits
// for the updates under way, and updates wait for it. Sums of arrays of at least
// MXNET_KVSTORE_BIGARRAY_BOUND elements are split over MXNET_KVSTORE_REDUCTION_NTHREADS threads.
//
// Ownership: Init copies the value; a push reads and a pull writes the caller's arrays only
// during the call, and the store never keeps them.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config/config.h"
#include "compression/codec.h"
#include "dtrain/kvstore/kvstore.h"
#include "kvstore/device_updates.h"
#include "kvstore/packed_pushes.h"
#include "optim/optimizer.h"

namespace dtrain {

class LocalKVStore final : public KVStore, public DeviceUpdates, public PackedPushes {
 public:
  // `type` is "local" or "device"; anything else is an InvalidArgument. Of `config` only the
  // reduction settings (reduction_threads, bigarray_bound) are used.
  explicit LocalKVStore(std::string type, const Config& config = Config());
  ~LocalKVStore() override;

  std::string type() const override { return type_; }
  int rank() const override { return 0; }
  int num_workers() const override { return 1; }

  using KVStore::Init;
  using KVStore::Pull;
  using KVStore::Push;
  using KVStore::PushPull;

  void Init(Key key, const Array& value) override;
  Operation Push(Key key, std::vector<Array> values, int priority = 0) override;
  Operation Pull(Key key, std::vector<Array> outs, int priority = 0) override;
  Operation PushPull(Key key, std::vector<Array> values, std::vector<Array> outs,
                     int priority = 0) override;

  void WaitAll() override {}
  void Barrier() override {}

  // Replaces the optimizer (its state starts afresh). Throws InvalidArgument for a bad spec, in
  // which case the optimizer in place stays.
  void SetOptimizer(const OptimizerSpec& spec) override;
  // Compresses each device's value when a push sums several (as MXNet's device store does
  // between GPUs), with a residual per key and device; a push of one value is not compressed.
  // (CUDA values pushed to "device" through DeviceStagingKVStore come compressed on their GPUs,
  // with their residuals there: PushPacked.)
  void SetGradientCompression(const std::map<std::string, std::string>& params) override;
  CompressionSpec gradient_compression() const override;
  std::string SaveOptimizerState() override;
  void LoadOptimizerState(const std::string& state) override;
  void SetLearningRate(double learning_rate, uint64_t from_update) override;

  bool UpdatesOnDevice(const std::vector<Array>& values) const override;
  bool HoldsOnDevice(Key key) const override;

  std::optional<CompressionSpec> CompressesEachOnDevice(
      const std::vector<Array>& values) const override;
  Operation PushPacked(Key key, const CompressionSpec& spec, std::vector<Array> packed,
                       std::vector<Array> outs) override;

 private:
  struct Slot;

  // The key's slot and the optimizer in place. Throws InvalidArgument for a key never initialised.
  Slot& Find(Key key, const char* call, std::shared_ptr<Optimizer>* optimizer,
             CompressionSpec* compression = nullptr) const;
  // Adds `values` to the slot: sum, then update or assign, on the host or (UpdatesOnDevice) on
  // their GPU. `packed`: they are compressed with `compression` already (PushPacked). The slot's
  // mutex is held.
  void Apply(Key key, Slot& slot, const std::vector<Array>& values, Optimizer* optimizer,
             const CompressionSpec* compression, bool packed = false) const;
  // dst = the sum of `values`, on several threads for big arrays. With compression (and several
  // values) each value goes through its compressed form: compressed here, with its residual in
  // `residuals`, or, where `residuals` is null, by the caller (the values are its words).
  void Sum(const Array& dst, const std::vector<Array>& values,
           std::vector<std::vector<float>>* residuals, const CompressionSpec* compression) const;

  const std::string type_;
  const int reduction_threads_;
  const int64_t bigarray_bound_;

  mutable std::shared_mutex mutex_;  // guards the table and the optimizer pointer, not the slots
  // Held shared by every update and exclusively to save or load the optimizer's state, which must
  // not change meanwhile (Optimizer: SaveState and LoadState never run during an Update). Taken
  // before a slot's mutex or mutex_, never while holding either.
  mutable std::shared_mutex updates_;
  std::unordered_map<Key, std::unique_ptr<Slot>> slots_;
  std::shared_ptr<Optimizer> optimizer_;
  CompressionSpec compression_;      // guarded by mutex_
  std::atomic<bool> pushed_{false};  // set by the first push: compression is fixed from then on
};

}  // namespace dtrain

// DeviceStagingKVStore: CUDA arrays through any KVStore, as MXNet moves GPU NDArrays.
//
// Wraps the store KVStore::Create made. Calls whose arrays are all on the host go straight
// through. Device arrays are staged through pinned host memory (src/cuda):
//   - push: for "device", "dist_sync_device" and "dist_async_device" with several device values and
//     no gradient compression that applies to the key, the values are summed on the first value's
//     GPU (peer copies for values on other GPUs) and only that sum is staged, once per key, as
//     MXNet's *_device stores aggregate on the GPU before the network; otherwise (MXNet's "local"
//     and "dist_sync" stage every device's value through the CPU) each value is staged and the
//     wrapped store sums them. The wrapped store then does exactly what it does for host values, so
//     results equal the host path's (float sums on the GPU are plain rounded adds, in the same
//     order).
//   - push with gradient compression, to a store that sends compressed values (StagedCalls: the
//     dist stores): the values are summed on the first one's GPU and compressed there
//     (compression/kernels/device_codec.h), and only the compressed bytes cross to the host and
//     on to the network. The key's residual stays on that GPU (a later push of the key whose
//     first value is on another GPU is refused, naming both). The bits equal those the wrapped
//     store would have sent from the same values on the host.
//   - push with gradient compression to "device" (PackedPushes), which compresses each value
//     before it sums them: each value is compressed on its own GPU, with a residual per key and
//     value there, and only the compressed bytes cross (as MXNet's device store quantizes each
//     GPU's gradient on that GPU); the store decompresses and sums them on the host, to the bits
//     it gives host values. (A push of the key with any host value among its values is staged
//     whole and uses the store's own residuals.)
//   - pull: into one pinned host array, copied to every device output once the wrapped pull is
//     done, before the returned Operation is done.
//   - in pieces, with the dist stores (StagedCalls): a value that crosses to the host as one array
//     is copied in pieces of DTRAIN_CHUNK_BYTES (the most a slot of the store holds; for
//     compressed bytes, the compressed size of that many floats), and the store sends each slot
//     once the piece holding its end is there, while later pieces are being copied; each part of
//     a pulled value is copied on to the devices once it has arrived, while the store waits for
//     the rest. The copies then hide behind the network instead of adding to it. Slots of a key
//     split over several servers need not end where pieces do: a slot may wait for one piece more.
//   - a local store's pushes that it sums and applies on their GPU (DeviceUpdates: device values
//     to "device", a single one to "local", with or without an optimizer) go to it as they are,
//     and pulls of keys it holds there are copied on the GPU; nothing is staged for them. (So the
//     staged sums above are the dist *_device stores', and "device"'s only where it declines.) Such
//     a push first waits until the calls queued before it have reached the store (only calls staged
//     meanwhile are), and a key's first update there waits for its weight's copy to the GPU.
// Copies are ordered after the work queued on each array's stream (cuda.h).
//
// Nothing else waits for the GPU on the caller's thread, which is often autograd's (a pull into
// host memory of a key held on a GPU waits for its copy, as any pull into host memory is written
// when it returns from a local store): a push starts its copies and returns, and the staging thread
// hands the host values to the wrapped store once they have arrived, in the order of the calls
// (host-only calls made meanwhile queue behind them, so a pull still sees an earlier push). Copies
// back to the device are waited for on a thread of their own, never on the wrapped store's network
// thread. Init, Barrier and the optimizer's calls first wait until every queued call has reached
// the wrapped store.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda.h"
#include "dtrain/kvstore/kvstore.h"
#include "kvstore/device_updates.h"
#include "kvstore/packed_pushes.h"
#include "kvstore/serial_queue.h"
#include "kvstore/staged_calls.h"

namespace dtrain {

class DeviceStagingKVStore final : public KVStore {
 public:
  explicit DeviceStagingKVStore(std::unique_ptr<KVStore> inner);
  ~DeviceStagingKVStore() override;

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

  // Host rows only: they reach the wrapped store once the calls queued before them have.
  Operation PushRows(Key key, std::vector<int64_t> rows, const Array& values,
                     int priority = 0) override;
  Operation PullRows(Key key, std::vector<int64_t> rows, const Array& out,
                     int priority = 0) override;
  void WaitAll() override;
  void Barrier() override {
    Flush();
    inner_->Barrier();
  }
  void SetOptimizer(const OptimizerSpec& spec) override {
    Flush();
    inner_->SetOptimizer(spec);
  }
  void SetGradientCompression(const std::map<std::string, std::string>& params) override {
    Flush();
    inner_->SetGradientCompression(params);
  }
  CompressionSpec gradient_compression() const override { return inner_->gradient_compression(); }
  std::string SaveOptimizerState() override {
    Flush();
    return inner_->SaveOptimizerState();
  }
  void LoadOptimizerState(const std::string& state) override {
    Flush();
    inner_->LoadOptimizerState(state);
  }
  void SetLearningRate(double learning_rate, uint64_t from_update) override {
    inner_->SetLearningRate(learning_rate, from_update);
  }

  // Where the copies back to devices are waited for; shared with the wrapped store's completions,
  // which may outlive this store (queue is null once it is closing).
  struct CopyBack {
    std::mutex mutex;
    SerialQueue* queue = nullptr;
  };

 private:
  // Starts copying `values` to the host (host ones pass as they are), summed on a GPU first where
  // the store aggregates on devices (above).
  cuda::Staged StartStaging(const std::vector<Array>& values) const;
  // How a push's device values are compressed on their GPUs.
  struct DeviceCompression {
    CompressionSpec spec;
    // Each value apart, for a store that sums them (PackedPushes); else their sum, for a store
    // that sends it (StagedCalls).
    bool each = false;
  };
  // The compression the wrapped store would give a push of `values`, where it can be applied on
  // their GPU instead: a store that takes packed pushes, or values packed one by one, and
  // `values` are float32 device values of one layout, which that compression applies to.
  // Otherwise none.
  std::optional<DeviceCompression> CompressesOnDevice(const std::vector<Array>& values) const;
  // Starts compressing `values` as `how` says (their sum on the first one's GPU, or each on its
  // own) and copying the compressed bytes to the host (one host array, or one per value).
  cuda::Staged StartCompressing(Key key, const std::vector<Array>& values,
                                const DeviceCompression& how);
  // The residual of value `index` of `key`'s pushes (`each`: compressed one by one; else 0, their
  // sum) for compression on `like`'s device (zeros at first). Throws InvalidArgument if that value
  // was compressed on another device before.
  Array ResidualOn(Key key, size_t index, const Array& like, bool each);
  // Whether the wrapped store takes a push of `values` as they are (DeviceUpdates), once the calls
  // queued before it have reached that store.
  bool UpdatedOnDevice(const std::vector<Array>& values);
  // Whether a call must go through the staging thread: it has device values, or calls before it
  // are still queued there.
  bool MustQueue(const std::vector<Array>& values);
  // What a staged call is given: the host values, and (where they arrive in pieces, which only
  // happens with staged_) the hook that waits for their first bytes (StagedCall::await_value).
  using Awaited = std::function<void(size_t bytes)>;
  using StagedCallback = std::function<Operation(std::vector<Array> hosts, Awaited await)>;
  // Queues `call` (the wrapped store's push or pushpull of `staged`'s host values) to run on the
  // staging thread once the copies have arrived (their first piece, where they come in pieces);
  // returns an operation done when its result is.
  Operation Later(Key key, const char* verb, cuda::Staged staged, StagedCallback call);
  // Where the wrapped store reports parts of a pulled value (StagedCall::output_ready); may be
  // null.
  using OutputReady = std::function<void(size_t begin, size_t end)>;
  // Runs `call` (the wrapped store's pull or pushpull) on host stand-ins for `outs`; where some are
  // on a device, the returned operation also copies the pulled value to them: each part the store
  // reports through the OutputReady it is given as soon as it does, the whole value once the
  // wrapped operation is done if it reported none.
  Operation IntoOutputs(
      Key key, std::vector<Array> outs,
      const std::function<Operation(std::vector<Array> hosts, OutputReady ready)>& call);
  // Checks `arrays` against the layout `key` was initialised with, at the call (InvalidArgument
  // naming the key), as the wrapped store checks host values: a staged call reaches it only later.
  // False if this store has not seen the key initialised: the caller then goes straight to the
  // wrapped store, whose error names it.
  bool CheckLayout(const char* call, Key key, const std::vector<Array>& arrays, const char* what);
  // Makes the thread that waits for copies into device memory, once.
  void StartCopyingBack();
  // `op`, a direct call of the wrapped store (DeviceUpdates) that queued copies into `outs` on the
  // GPU, done only once they have finished (waited for on that thread), as a staged pull is done
  // once its outputs are written.
  Operation OnceCopied(Key key, const char* verb, Operation op, const std::vector<Array>& outs);
  // Waits until every queued call has reached the wrapped store.
  void Flush();
  void Track(const Operation& op);  // for WaitAll

  const std::unique_ptr<KVStore> inner_;
  StagedCalls* const staged_;            // inner_, where it takes staged calls; else null
  DeviceUpdates* const device_updates_;  // inner_, where it updates on devices; else null
  PackedPushes* const packed_pushes_;    // inner_, where it takes values packed one by one
  const bool aggregate_on_device_;       // "device" and "dist_*_device"
  const Duration timeout_;               // DTRAIN_REQUEST_TIMEOUT_MS
  const size_t piece_bytes_;  // DTRAIN_CHUNK_BYTES with staged_, else 0 (copies made whole)
  std::mutex mutex_;
  std::vector<Operation> in_flight_;  // operations of staged calls, possibly not done
  // Each initialised key's layout: an Array header without data (CheckArrays reads its shape).
  std::map<Key, Array> layouts_;
  // Error feedback of the keys compressed on a GPU, per key and value (only value 0 where their
  // sum is compressed), in that GPU's memory (device_codec.h).
  std::map<std::pair<Key, size_t>, Array> residuals_;
  // Made on the first device call, so a store that never sees one runs no extra thread.
  std::unique_ptr<SerialQueue> staging_;
  std::unique_ptr<SerialQueue> copying_back_;
  const std::shared_ptr<CopyBack> copy_back_ = std::make_shared<CopyBack>();
};

}  // namespace dtrain

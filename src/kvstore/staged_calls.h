// Calls from DeviceStagingKVStore, which moves CUDA values through pinned host memory, to the
// store it wraps, where that store can do better than with its plain KVStore calls:
//   - a pushed value the caller has already compressed (on its GPU:
//     compression/kernels/device_codec.h), so that only the compressed bytes cross to the host;
//   - a pushed value still arriving on the host, front to back, and outputs the caller copies on
//     to GPUs part by part: the store sends each part of the value once it is there and reports
//     each part of the output once it is written, so that the copies between host and GPU overlap
//     the network's work (done whole, the two copies of a 64 MB value were about 2.5 ms of an
//     8 ms pushpull on an H200).
// Implemented by the stores that send values over the network (DistKVStore).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "dtrain/common/array.h"
#include "dtrain/compression/compression_spec.h"
#include "dtrain/kvstore/kvstore.h"

namespace dtrain {

// A push (`outs` empty), pull (`values` empty) or pushpull of `key` in host memory.
struct StagedCall {
  // A call with these arrays and no packing or hooks (the fields below, set after as needed).
  static StagedCall Of(Key key, std::vector<Array> values, std::vector<Array> outs, int priority) {
    StagedCall call;
    call.key = key;
    call.values = std::move(values);
    call.outs = std::move(outs);
    call.priority = priority;
    return call;
  }

  Key key = 0;
  // The pushed host values, summed by the store as Push sums them; or, with `packed`, one array
  // holding that sum compressed with `packed` as codec.h's Compress does: CompressedBytes(type, n)
  // bytes for the key's n values (its shape and dtype do not matter). The caller then keeps the
  // residual of 2-bit and 1-bit; the store's own residual for the key is neither read nor changed.
  std::vector<Array> values;
  std::optional<CompressionSpec> packed;
  // Host arrays the pulled value is written to.
  std::vector<Array> outs;
  int priority = 0;
  // Returns once the first `bytes` bytes of values[0] are on the host, or throws if they never
  // will be; null when all of them are. Called on the calling thread, with growing counts, before
  // the store sends what those bytes hold. If it throws, the parts of the value not sent yet fail
  // the operation with its error; the parts already sent stay sent (as when a push fails part of
  // the way for any other reason: in dist_sync the key's slots are then a round apart, and the
  // job should stop).
  std::function<void(size_t bytes)> await_value;
  // Told that bytes [begin, end) of outs[0] (and of the other outputs) hold the pulled value, on a
  // network thread: it must neither block nor throw. Before a successful operation is done, every
  // byte has been told once.
  std::function<void(size_t begin, size_t end)> output_ready;
};

class StagedCalls {
 public:
  virtual ~StagedCalls() = default;

  // Checks `call` as Push, Pull and PushPull check their arrays. A packed value is refused too
  // (InvalidArgument) unless its spec is the store's compression and applies to the key, the key
  // holds float32 values and the array has the right byte count in host memory. A refusal sends
  // nothing and leaves the store as it was (compression may still be set if nothing was pushed
  // before).
  virtual Operation IssueStaged(StagedCall call) = 0;

  // A push (`outs` empty) or pushpull of a value compressed by the caller, all on the host.
  Operation PushPacked(Key key, const CompressionSpec& spec, Array packed, std::vector<Array> outs,
                       int priority) {
    StagedCall call = StagedCall::Of(key, {std::move(packed)}, std::move(outs), priority);
    call.packed = spec;
    return IssueStaged(std::move(call));
  }
};

}  // namespace dtrain

// Pushes whose value the caller has already compressed: DeviceStagingKVStore compresses CUDA
// values on their GPU (compression/kernels/device_codec.h), so that only the compressed bytes
// cross to the host, and hands them on here. Implemented by the stores that send compressed values
// over the network (DistKVStore).
#pragma once

#include <vector>

#include "dtrain/common/array.h"
#include "dtrain/compression/compression_spec.h"
#include "dtrain/kvstore/kvstore.h"

namespace dtrain {

class PackedPushes {
 public:
  virtual ~PackedPushes() = default;

  // A push (`outs` empty) or pushpull (into `outs`) of `key`, whose value, summed over the
  // caller's devices, `packed` holds compressed with `spec` as codec.h's Compress does: its bytes
  // are CompressedBytes(spec.type, n) for the key's n values (its shape and dtype do not matter).
  // The caller keeps the residual of 2-bit and 1-bit; this store's own residual for the key is
  // neither read nor changed. Throws InvalidArgument unless `spec` is the store's compression and
  // applies to the key, the key holds float32 values and `packed` has that many bytes in host
  // memory; such a refusal sends nothing and leaves the store as it was (compression may still be
  // set if nothing was pushed before).
  virtual Operation PushPacked(Key key, const CompressionSpec& spec, Array packed,
                               std::vector<Array> outs, int priority) = 0;
};

}  // namespace dtrain

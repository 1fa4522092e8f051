// How DeviceStagingKVStore, which moves CUDA values through pinned host memory, learns that the
// store it wraps compresses each pushed value apart before it sums them, so that each value can be
// compressed on its own GPU and only the compressed bytes cross to the host: MXNet's device store
// quantizes each GPU's gradient on that GPU, with a residual per GPU
// (CommDevice::ReduceCompressed), and sums the dequantized values. Implemented by LocalKVStore:
// only "device" asks for packed values, though either type takes them.
#pragma once

#include <optional>
#include <vector>

#include "dtrain/common/array.h"
#include "dtrain/compression/compression_spec.h"
#include "dtrain/kvstore/kvstore.h"

namespace dtrain {

class PackedPushes {
 public:
  virtual ~PackedPushes() = default;

  // The compression a push of `values` gets value by value, where each may be compressed on its
  // own GPU instead: a "device" store whose compression applies to them (several float32 device
  // values of one size). Otherwise none.
  virtual std::optional<CompressionSpec> CompressesEachOnDevice(
      const std::vector<Array>& values) const = 0;
  // A push (`outs` empty) or pushpull of `key` whose values the caller has compressed, one host
  // array each of CompressedBytes(spec.type, n) bytes for the key's n values, as Push would
  // compress them itself (codec.h's Compress, with the caller's residuals: the store's own are
  // neither read nor changed). They are decompressed and summed in order, as Push sums the values
  // it compresses, and the sum is applied as Push applies it. The words are the caller's own, not
  // checked for 2-bit's unused code (codec.h's WellFormed; Decompress reads it as 0). Refused with
  // InvalidArgument, changing nothing, unless `spec` is the store's compression and applies to
  // the key, which holds float32 values, and every array has that byte count in host memory.
  virtual Operation PushPacked(Key key, const CompressionSpec& spec, std::vector<Array> packed,
                               std::vector<Array> outs) = 0;
};

}  // namespace dtrain

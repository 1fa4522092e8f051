// Gradient compression settings (KVStore::SetGradientCompression): which codec and its
// threshold. The codecs themselves and their bit layouts are private to dtrain; what each type
// sends and its rule: docs/reference.md ("Gradient compression, as a user sets it").
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace dtrain {

enum class Compression : uint8_t { kNone = 0, kTwoBit = 1, kOneBit = 2, kFp16 = 3 };

std::string_view CompressionName(Compression type);  // "none", "2bit", "1bit", "fp16"

struct CompressionSpec {
  Compression type = Compression::kNone;
  float threshold = 0;
  // Keys with fewer elements travel uncompressed (as BytePS's BYTEPS_MIN_COMPRESS_BYTES): they
  // weigh little on the wire, and small layers' gradients (conv1, biases) are where error
  // feedback's delays hurt accuracy most. 0, MXNet's behaviour, compresses every key.
  int64_t min_elements = 0;

  // From MXNet's parameters: {"type": "none|2bit|1bit|fp16", "threshold": "T"}, and dtrain's
  // "min_elements": "N". Without a threshold the type's default (DefaultThreshold). Throws
  // InvalidArgument for an unknown key or type, a threshold that is not a finite number, <= 0 for
  // 2bit or < 0 for 1bit, a threshold given with none or fp16 (which do not use one), or a
  // min_elements that is not a non-negative integer.
  static CompressionSpec FromParams(const std::map<std::string, std::string>& params);
  static float DefaultThreshold(Compression type);
  // Throws InvalidArgument unless the threshold suits the type (as FromParams checks).
  void Validate() const;
  bool enabled() const { return type != Compression::kNone; }
  // Whether a key of `elements` values is compressed.
  bool AppliesTo(int64_t elements) const { return enabled() && elements >= min_elements; }
  std::string ToString() const;  // "2bit (threshold 0.5, keys of 4096 elements or more)"
};

}  // namespace dtrain

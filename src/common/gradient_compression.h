// Gradient compression, as MXNet's kvstore has it (2-bit and 1-bit with error feedback), plus
// float16.
//
// A worker compresses what it pushes; the server decompresses each push into float32 and sums.
// 2-bit and 1-bit keep a residual per element on the worker (error feedback): what was not sent
// this time is added to the next gradient, so over many steps nothing is lost.
//
//   2bit, threshold t > 0:  r += g;  r >= t: send +t, r -= t;  r <= -t: send -t, r += t;  else 0.
//                           16 values per 32-bit word, value i in bits 2i..2i+1 (01 +t, 10 -t,
//                           00 zero; 11 never appears and marks a malformed word).
//   1bit, threshold t >= 0: r += g;  r > t: send +1, r -= 1;  else send -1, r += 1.
//                           32 values per 32-bit word, value i in bit i (1: +1, 0: -1).
//   fp16:                   each value rounded to IEEE half precision (to nearest even); no
//                           residual.
//
// The words are little-endian; the last word of a push is padded with zero bits. Every function
// here is element-wise on (pointer, count), so compressing a whole key and slicing the words at
// multiples of 32 elements gives the same bits as compressing each slice. The CPU's AVX2 is used
// where it has it, with the same results bit for bit as the scalar path.
//
// Threads: plain functions; the caller owns the memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace dtrain {

enum class Compression : uint8_t { kNone = 0, kTwoBit = 1, kOneBit = 2, kFp16 = 3 };

// Element counts of a compressed piece start at multiples of this (the values in one 1-bit word):
// key partitions cut big values here, so every slot's words start at a word boundary.
constexpr int64_t kCompressionAlignment = 32;

std::string_view CompressionName(Compression type);  // "none", "2bit", "1bit", "fp16"
bool IsValidCompression(uint8_t raw);

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

// Bytes of `n` float32 values compressed with `type` (n * 4 for kNone).
size_t CompressedBytes(Compression type, int64_t n);

// residual[i] += grad[i], then encodes the residual into `out` (CompressedBytes(type, n) bytes)
// and takes what was sent out of it. fp16 ignores `residual` (it may be null).
void Compress(const CompressionSpec& spec, const float* grad, float* residual, int64_t n,
              void* out);

// The values `packed` holds: out[i] = value (accumulate: out[i] += value). The caller has
// checked the size (CompressedBytes) and, for 2bit, the words (WellFormed).
void Decompress(const CompressionSpec& spec, const void* packed, int64_t n, float* out,
                bool accumulate);

// False if a 2-bit word of the `n` values holds the unused code 11 (bytes from the network).
bool WellFormed(Compression type, const void* packed, int64_t n);

}  // namespace dtrain

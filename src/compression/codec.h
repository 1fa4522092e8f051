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

#include "dtrain/compression/compression_spec.h"

namespace dtrain {

// Element counts of a compressed piece start at multiples of this (the values in one 1-bit word):
// key partitions cut big values here, so every slot's words start at a word boundary.
constexpr int64_t kCompressionAlignment = 32;

// Whether `raw` (a byte off the wire) is one of Compression's values.
bool IsValidCompression(uint8_t raw);

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

// Gradient compression's formats (codec.h), one element at a time: what a value adds to its
// residual, which code it sends and what stays behind. Shared by the host's scalar path
// (codec.cc, which the AVX2 path matches bit for bit) and the CUDA kernels (device_codec.cu), so
// that a GPU compresses to the bits the host would. Only adds and compares: no rounding choice can
// differ between them.
//
// Kept to C++17 and free of the rest of dtrain: nvcc compiles it too.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DTRAIN_CODEC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DTRAIN_CODEC_HOST_DEVICE inline
#endif

namespace dtrain::codec {

constexpr int64_t kTwoBitPerWord = 16;
constexpr int64_t kOneBitPerWord = 32;

// 2-bit: residual += grad, then 1 (+t sent, taken out of the residual), 2 (-t sent, put back) or 0.
DTRAIN_CODEC_HOST_DEVICE uint32_t TwoBitCode(float grad, float& residual, float t) {
  float v = residual + grad;
  uint32_t code = 0;
  if (v >= t) {
    v -= t;
    code = 1;
  } else if (v <= -t) {
    v += t;
    code = 2;
  }
  residual = v;
  return code;
}

// 1-bit: residual += grad, then 1 (+1 sent) if it is above t, else 0 (-1 sent).
DTRAIN_CODEC_HOST_DEVICE uint32_t OneBitCode(float grad, float& residual, float t) {
  const float v = residual + grad;
  const bool positive = v > t;
  residual = positive ? v - 1.0f : v + 1.0f;
  return positive ? 1u : 0u;
}

}  // namespace dtrain::codec

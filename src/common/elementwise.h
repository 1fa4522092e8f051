// Element-wise arithmetic on raw buffers of every dtype dtrain moves: sums (MPI and Gloo know
// float32/float64 but not float16/bfloat16; servers sum pushes of every dtype), the other
// reductions of allreduce mode (Horovod's Min, Max and Product), the scaling that turns a sum into
// an average, and the float32 <-> float16 conversions (DTRAIN_FP16_ALLREDUCE, fp16 gradient
// compression).
//
// Plain functions on (pointer, count); the caller owns the memory. Thread-safe. float16 uses the
// CPU's F16C instructions where it has them and a bit-exact software path otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtrain/common/dtype.h"

namespace dtrain {

// memcpy with stores that bypass the caches where the CPU has them (x86-64's non-temporal
// stores), for copies that will not be read soon: the push log's, which would otherwise evict
// the training step's working set. `out` must not overlap `in`. Ordered before later stores.
void CopyBypassingCaches(void* out, const void* in, size_t bytes);

// out[i] = a[i] + b[i]; `out` may alias `a` or `b`. Rounds once per element, to nearest even.
void Sum(void* out, const void* a, const void* b, size_t n, DType dtype);
// dst[i] += src[i] for n elements of `dtype` (float16 and bfloat16 through float32, rounded once).
void AddInto(void* dst, const void* src, int64_t n, DType dtype);

// How two values combine into one in a reduction.
enum class Reduction : uint8_t { kSum, kMin, kMax, kProduct };

// out[i] = a[i] (how) b[i]; `out` may alias `a` or `b`. Min and Max propagate NaN from either
// side, as torch's do; half types combine in float and round once.
void Reduce(void* out, const void* a, const void* b, size_t n, DType dtype, Reduction how);

// Fills `data` with the value that leaves every other unchanged under `how`: 0 for sums, +inf for
// Min, -inf for Max, 1 for Product. A rank with nothing to contribute (Horovod's join) stands in
// with it.
void FillIdentity(void* data, size_t n, DType dtype, Reduction how);

// data[i] *= factor.
void Scale(void* data, size_t n, DType dtype, double factor);

// IEEE half precision, rounding to nearest even; overflow gives infinity.
void FloatToHalf(const float* in, uint16_t* out, size_t n);
void HalfToFloat(const uint16_t* in, float* out, size_t n);

// Scalar forms, for tests.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

}  // namespace dtrain

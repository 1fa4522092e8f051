#include "common/elementwise.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

// Software conversions, exact for every input (subnormals, infinities, NaN kept quiet).
uint16_t SoftFloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // infinity or NaN
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x0200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to beyond 65504: infinity
  if (abs < 0x38800000u) {
    // Below the smallest normal half: a subnormal. Adding 0.5 makes the FPU round the mantissa
    // to the subnormal grid (2^-24) to nearest even for us.
    const float shifted = std::bit_cast<float>(abs) + 0.5f;
    return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(shifted) - 0x3f000000u);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const uint32_t odd = (abs >> 13) & 1u;
  return sign | static_cast<uint16_t>((abs + 0xc8000fffu + odd) >> 13);
}

float SoftHalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(value) | sign);
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToBFloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float BFloat16ToFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

#if defined(__x86_64__)
// CPUID leaf 1: F16C (ecx bit 29), AVX (bit 28) and OSXSAVE (bit 27), and the OS saving the AVX
// registers (XCR0 bits 1-2). Asked directly: clang before 15 knows no "f16c" for
// __builtin_cpu_supports, and the fuzzers are built with clang 14.
bool HasF16C() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
    const unsigned needed = (1u << 29) | (1u << 28) | (1u << 27);
    if ((c & needed) != needed) return false;
    unsigned xcr0_low = 0, xcr0_high = 0;
    __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    return (xcr0_low & 6u) == 6u;
  }();
  return has;
}

__attribute__((target("avx,f16c"))) void F16CFloatToHalf(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = SoftFloatToHalf(in[i]);
}

__attribute__((target("avx,f16c"))) void F16CHalfToFloat(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = SoftHalfToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void F16CSumHalf(uint16_t* out, const uint16_t* a,
                                                     const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) out[i] = SoftFloatToHalf(SoftHalfToFloat(a[i]) + SoftHalfToFloat(b[i]));
}
#else
bool HasF16C() { return false; }
void F16CFloatToHalf(const float*, uint16_t*, size_t) {}
void F16CHalfToFloat(const uint16_t*, float*, size_t) {}
void F16CSumHalf(uint16_t*, const uint16_t*, const uint16_t*, size_t) {}
#endif

template <typename T>
void SumTyped(void* out, const void* a, const void* b, size_t n) {
  // Pointers may alias (out == a for an in-place reduction), so no __restrict here.
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

// A half-precision sum goes through float: exact for the addition, one rounding at the end.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void SumViaFloat(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = FromFloat(ToFloat(x[i]) + ToFloat(y[i]));
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ScaleViaFloat(void* data, size_t n, float factor) {
  auto* d = static_cast<uint16_t*>(data);
  for (size_t i = 0; i < n; ++i) d[i] = FromFloat(ToFloat(d[i]) * factor);
}

template <typename T, typename Combine>
void CombineTyped(void* out, const void* a, const void* b, size_t n, Combine combine) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = combine(x[i], y[i]);
}

template <typename Combine>
void CombineHalf(void* out, const void* a, const void* b, size_t n, DType dtype, Combine combine) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  const bool bf16 = dtype == DType::kBFloat16;
  for (size_t i = 0; i < n; ++i) {
    const float fx = bf16 ? BFloat16ToFloat(x[i]) : SoftHalfToFloat(x[i]);
    const float fy = bf16 ? BFloat16ToFloat(y[i]) : SoftHalfToFloat(y[i]);
    const float r = combine(fx, fy);
    o[i] = bf16 ? FloatToBFloat16(r) : SoftFloatToHalf(r);
  }
}

template <typename Combine>
void CombineAny(void* out, const void* a, const void* b, size_t n, DType dtype, Combine combine) {
  switch (dtype) {
    case DType::kFloat32:
      return CombineTyped<float>(out, a, b, n, combine);
    case DType::kFloat64:
      return CombineTyped<double>(out, a, b, n, combine);
    case DType::kFloat16:
    case DType::kBFloat16:
      return CombineHalf(out, a, b, n, dtype, combine);
  }
  throw InvalidArgument("cannot reduce values of dtype " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

void CopyBypassingCaches(void* out, const void* in, size_t bytes) {
#if defined(__x86_64__)
  auto* dst = static_cast<char*>(out);
  const auto* src = static_cast<const char*>(in);
  // Up to a 16-byte boundary of the destination with plain stores, then 64 bytes a step.
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t at = head;
  for (; at + 64 <= bytes; at += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at + 48), d);
  }
  std::memcpy(dst + at, src + at, bytes - at);
  _mm_sfence();  // streaming stores are weakly ordered: visible before whatever is stored next
#else
  std::memcpy(out, in, bytes);
#endif
}

uint16_t FloatToHalf(float f) { return SoftFloatToHalf(f); }
float HalfToFloat(uint16_t h) { return SoftHalfToFloat(h); }

void FloatToHalf(const float* in, uint16_t* out, size_t n) {
  if (HasF16C()) return F16CFloatToHalf(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = SoftFloatToHalf(in[i]);
}

void HalfToFloat(const uint16_t* in, float* out, size_t n) {
  if (HasF16C()) return F16CHalfToFloat(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = SoftHalfToFloat(in[i]);
}

void Sum(void* out, const void* a, const void* b, size_t n, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return SumTyped<float>(out, a, b, n);
    case DType::kFloat64:
      return SumTyped<double>(out, a, b, n);
    case DType::kFloat16:
      if (HasF16C()) {
        return F16CSumHalf(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
                           static_cast<const uint16_t*>(b), n);
      }
      return SumViaFloat<SoftHalfToFloat, SoftFloatToHalf>(out, a, b, n);
    case DType::kBFloat16:
      return SumViaFloat<BFloat16ToFloat, FloatToBFloat16>(out, a, b, n);
  }
  throw InvalidArgument("cannot sum values of dtype " + std::to_string(static_cast<int>(dtype)));
}

void AddInto(void* dst, const void* src, int64_t n, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float* __restrict d = static_cast<float*>(dst);
      const float* __restrict s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] += s[i];
      return;
    }
    case DType::kFloat64: {
      double* __restrict d = static_cast<double*>(dst);
      const double* __restrict s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] += s[i];
      return;
    }
    case DType::kFloat16:
    case DType::kBFloat16:
      // Through float32, one rounding per element.
      return Sum(dst, dst, src, static_cast<size_t>(n), dtype);
  }
  throw InvalidArgument("cannot sum values of dtype " + std::to_string(static_cast<int>(dtype)));
}

void Reduce(void* out, const void* a, const void* b, size_t n, DType dtype, Reduction how) {
  switch (how) {
    case Reduction::kSum:
      return Sum(out, a, b, n, dtype);
    case Reduction::kMin:
      return CombineAny(out, a, b, n, dtype,
                        [](auto x, auto y) { return x < y || x != x ? x : y; });
    case Reduction::kMax:
      return CombineAny(out, a, b, n, dtype,
                        [](auto x, auto y) { return x > y || x != x ? x : y; });
    case Reduction::kProduct:
      return CombineAny(out, a, b, n, dtype, [](auto x, auto y) { return x * y; });
  }
  throw InvalidArgument("unknown reduction " + std::to_string(static_cast<int>(how)));
}

void FillIdentity(void* data, size_t n, DType dtype, Reduction how) {
  if (how == Reduction::kSum) {
    std::memset(data, 0, n * DTypeSize(dtype));
    return;
  }
  const double value = how == Reduction::kProduct ? 1.0
                       : how == Reduction::kMin   ? std::numeric_limits<double>::infinity()
                                                  : -std::numeric_limits<double>::infinity();
  switch (dtype) {
    case DType::kFloat32:
      std::fill_n(static_cast<float*>(data), n, static_cast<float>(value));
      return;
    case DType::kFloat64:
      std::fill_n(static_cast<double*>(data), n, value);
      return;
    case DType::kFloat16:
      std::fill_n(static_cast<uint16_t*>(data), n, SoftFloatToHalf(static_cast<float>(value)));
      return;
    case DType::kBFloat16:
      std::fill_n(static_cast<uint16_t*>(data), n, FloatToBFloat16(static_cast<float>(value)));
      return;
  }
}

void Scale(void* data, size_t n, DType dtype, double factor) {
  switch (dtype) {
    case DType::kFloat32: {
      auto* d = static_cast<float*>(data);
      const float f = static_cast<float>(factor);
      for (size_t i = 0; i < n; ++i) d[i] *= f;
      return;
    }
    case DType::kFloat64: {
      auto* d = static_cast<double*>(data);
      for (size_t i = 0; i < n; ++i) d[i] *= factor;
      return;
    }
    case DType::kFloat16:
      return ScaleViaFloat<SoftHalfToFloat, SoftFloatToHalf>(data, n, static_cast<float>(factor));
    case DType::kBFloat16:
      return ScaleViaFloat<BFloat16ToFloat, FloatToBFloat16>(data, n, static_cast<float>(factor));
  }
  throw InvalidArgument("cannot scale values of dtype " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace dtrain

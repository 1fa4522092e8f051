#include "compression/codec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/elementwise.h"
#include "compression/kernels/formulas.h"
#include "dtrain/common/error.h"

namespace dtrain {
namespace {

using codec::kOneBitPerWord;
using codec::kTwoBitPerWord;

int64_t Words(int64_t n, int64_t per_word) { return (n + per_word - 1) / per_word; }

// --- scalar paths: every format's words built from kernels/formulas.h, which defines the codes;
// the AVX2 paths below match them bit for bit (and the GPU's, kernels/device_codec.cu).

void TwoBitCompressScalar(const float* g, float* r, int64_t begin, int64_t end, float t,
                          uint32_t* out) {
  for (int64_t w = begin / kTwoBitPerWord; w * kTwoBitPerWord < end; ++w) {
    uint32_t word = 0;
    const int64_t first = w * kTwoBitPerWord;
    for (int64_t i = first; i < std::min(end, first + kTwoBitPerWord); ++i) {
      word |= codec::TwoBitCode(g[i], r[i], t) << (2 * (i - first));
    }
    out[w] = word;
  }
}

void TwoBitDecompressScalar(const uint32_t* in, int64_t begin, int64_t end, float t, float* out,
                            bool accumulate) {
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t code = (in[i / kTwoBitPerWord] >> (2 * (i % kTwoBitPerWord))) & 3u;
    const float value = code == 1 ? t : code == 2 ? -t : 0.0f;
    out[i] = accumulate ? out[i] + value : value;
  }
}

void OneBitCompressScalar(const float* g, float* r, int64_t begin, int64_t end, float t,
                          uint32_t* out) {
  for (int64_t w = begin / kOneBitPerWord; w * kOneBitPerWord < end; ++w) {
    uint32_t word = 0;
    const int64_t first = w * kOneBitPerWord;
    for (int64_t i = first; i < std::min(end, first + kOneBitPerWord); ++i) {
      word |= codec::OneBitCode(g[i], r[i], t) << (i - first);
    }
    out[w] = word;
  }
}

void OneBitDecompressScalar(const uint32_t* in, int64_t begin, int64_t end, float* out,
                            bool accumulate) {
  for (int64_t i = begin; i < end; ++i) {
    const float value = ((in[i / kOneBitPerWord] >> (i % kOneBitPerWord)) & 1u) ? 1.0f : -1.0f;
    out[i] = accumulate ? out[i] + value : value;
  }
}

#if defined(__x86_64__)
bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// 8 bits spread to the even bits of 16 (bit i -> bit 2i): a movemask of 8 lanes becomes the low
// or high bits of eight 2-bit codes.
constexpr std::array<uint16_t, 256> MakeSpread() {
  std::array<uint16_t, 256> table{};
  for (unsigned b = 0; b < 256; ++b) {
    uint16_t s = 0;
    for (unsigned i = 0; i < 8; ++i) s |= static_cast<uint16_t>(((b >> i) & 1u) << (2 * i));
    table[b] = s;
  }
  return table;
}
constexpr std::array<uint16_t, 256> kSpread = MakeSpread();

// Full words only; returns the number of elements done (a multiple of 16).
__attribute__((target("avx2"))) int64_t TwoBitCompressAvx2(const float* g, float* r, int64_t n,
                                                           float t, uint32_t* out) {
  const __m256 pos_t = _mm256_set1_ps(t);
  const __m256 neg_t = _mm256_set1_ps(-t);
  const int64_t full = n / kTwoBitPerWord;
  for (int64_t w = 0; w < full; ++w) {
    uint32_t word = 0;
    for (int half = 0; half < 2; ++half) {
      const int64_t i = w * kTwoBitPerWord + 8 * half;
      __m256 v = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(g + i));
      const __m256 pos = _mm256_cmp_ps(v, pos_t, _CMP_GE_OQ);
      const __m256 neg = _mm256_cmp_ps(v, neg_t, _CMP_LE_OQ);
      v = _mm256_blendv_ps(v, _mm256_sub_ps(v, pos_t), pos);
      v = _mm256_blendv_ps(v, _mm256_add_ps(v, pos_t), neg);
      _mm256_storeu_ps(r + i, v);
      const uint32_t code = kSpread[_mm256_movemask_ps(pos)] |
                            static_cast<uint32_t>(kSpread[_mm256_movemask_ps(neg)]) << 1;
      word |= code << (16 * half);
    }
    out[w] = word;
  }
  return full * kTwoBitPerWord;
}

__attribute__((target("avx2"))) int64_t TwoBitDecompressAvx2(const uint32_t* in, int64_t n, float t,
                                                             float* out, bool accumulate) {
  const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i three = _mm256_set1_epi32(3);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i two = _mm256_set1_epi32(2);
  const __m256 pos_t = _mm256_set1_ps(t);
  const __m256 neg_t = _mm256_set1_ps(-t);
  const int64_t full = n / kTwoBitPerWord;
  for (int64_t w = 0; w < full; ++w) {
    for (int half = 0; half < 2; ++half) {
      const int64_t i = w * kTwoBitPerWord + 8 * half;
      const __m256i word = _mm256_set1_epi32(static_cast<int>(in[w] >> (16 * half)));
      const __m256i code = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), three);
      const __m256 pos = _mm256_castsi256_ps(_mm256_cmpeq_epi32(code, one));
      const __m256 neg = _mm256_castsi256_ps(_mm256_cmpeq_epi32(code, two));
      // +t, -t or +0.0f, as the scalar path's values.
      const __m256 value = _mm256_or_ps(_mm256_and_ps(pos, pos_t), _mm256_and_ps(neg, neg_t));
      _mm256_storeu_ps(out + i,
                       accumulate ? _mm256_add_ps(_mm256_loadu_ps(out + i), value) : value);
    }
  }
  return full * kTwoBitPerWord;
}

__attribute__((target("avx2"))) int64_t OneBitCompressAvx2(const float* g, float* r, int64_t n,
                                                           float t, uint32_t* out) {
  const __m256 threshold = _mm256_set1_ps(t);
  const __m256 unit = _mm256_set1_ps(1.0f);
  const int64_t full = n / kOneBitPerWord;
  for (int64_t w = 0; w < full; ++w) {
    uint32_t word = 0;
    for (int quarter = 0; quarter < 4; ++quarter) {
      const int64_t i = w * kOneBitPerWord + 8 * quarter;
      const __m256 v = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(g + i));
      const __m256 pos = _mm256_cmp_ps(v, threshold, _CMP_GT_OQ);
      _mm256_storeu_ps(r + i,
                       _mm256_blendv_ps(_mm256_add_ps(v, unit), _mm256_sub_ps(v, unit), pos));
      word |= static_cast<uint32_t>(_mm256_movemask_ps(pos)) << (8 * quarter);
    }
    out[w] = word;
  }
  return full * kOneBitPerWord;
}

__attribute__((target("avx2"))) int64_t OneBitDecompressAvx2(const uint32_t* in, int64_t n,
                                                             float* out, bool accumulate) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 plus = _mm256_set1_ps(1.0f);
  const __m256 minus = _mm256_set1_ps(-1.0f);
  const int64_t full = n / kOneBitPerWord;
  for (int64_t w = 0; w < full; ++w) {
    for (int quarter = 0; quarter < 4; ++quarter) {
      const int64_t i = w * kOneBitPerWord + 8 * quarter;
      const __m256i byte = _mm256_set1_epi32(static_cast<int>((in[w] >> (8 * quarter)) & 0xffu));
      const __m256 set =
          _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(byte, bits), bits));
      const __m256 value = _mm256_blendv_ps(minus, plus, set);
      _mm256_storeu_ps(out + i,
                       accumulate ? _mm256_add_ps(_mm256_loadu_ps(out + i), value) : value);
    }
  }
  return full * kOneBitPerWord;
}
#else
bool HasAvx2() { return false; }
int64_t TwoBitCompressAvx2(const float*, float*, int64_t, float, uint32_t*) { return 0; }
int64_t TwoBitDecompressAvx2(const uint32_t*, int64_t, float, float*, bool) { return 0; }
int64_t OneBitCompressAvx2(const float*, float*, int64_t, float, uint32_t*) { return 0; }
int64_t OneBitDecompressAvx2(const uint32_t*, int64_t, float*, bool) { return 0; }
#endif

void Fp16Decompress(const uint16_t* in, int64_t n, float* out, bool accumulate) {
  if (!accumulate) return HalfToFloat(in, out, static_cast<size_t>(n));
  constexpr int64_t kChunk = 1024;
  float values[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    HalfToFloat(in + i, values, static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) out[i + j] += values[j];
  }
}

float ParseThreshold(const std::string& text) {
  size_t used = 0;
  float value = 0;
  try {
    value = std::stof(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value)) {
    throw InvalidArgument("gradient compression threshold '" + text + "' is not a finite number");
  }
  return value;
}

int64_t ParseMinElements(const std::string& text) {
  // Digits only: std::stoll alone would also take leading spaces and a sign.
  const bool digits = !text.empty() && text.size() <= 18 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  const long long value = digits ? std::stoll(text) : -1;
  if (value < 0) {
    throw InvalidArgument("gradient compression min_elements '" + text +
                          "' is not a non-negative integer");
  }
  return value;
}

}  // namespace

std::string_view CompressionName(Compression type) {
  switch (type) {
    case Compression::kNone:
      return "none";
    case Compression::kTwoBit:
      return "2bit";
    case Compression::kOneBit:
      return "1bit";
    case Compression::kFp16:
      return "fp16";
  }
  return "unknown";
}

bool IsValidCompression(uint8_t raw) { return raw <= static_cast<uint8_t>(Compression::kFp16); }

float CompressionSpec::DefaultThreshold(Compression type) {
  switch (type) {
    case Compression::kTwoBit:
      return 0.5f;  // MXNet's default
    case Compression::kOneBit:
      return 0.0f;
    default:
      return 0.0f;
  }
}

void CompressionSpec::Validate() const {
  if (!IsValidCompression(static_cast<uint8_t>(type))) {
    throw InvalidArgument("unknown gradient compression type " +
                          std::to_string(static_cast<int>(type)));
  }
  if (!std::isfinite(threshold)) {
    throw InvalidArgument("gradient compression threshold must be a finite number");
  }
  if (type == Compression::kTwoBit && !(threshold > 0)) {
    throw InvalidArgument("2bit gradient compression needs a threshold > 0, got " + ToString());
  }
  if (type == Compression::kOneBit && threshold < 0) {
    throw InvalidArgument("1bit gradient compression needs a threshold >= 0, got " + ToString());
  }
  if ((type == Compression::kNone || type == Compression::kFp16) && threshold != 0) {
    throw InvalidArgument(std::string(CompressionName(type)) +
                          " gradient compression takes no threshold");
  }
}

CompressionSpec CompressionSpec::FromParams(const std::map<std::string, std::string>& params) {
  for (const auto& [key, value] : params) {
    if (key != "type" && key != "threshold" && key != "min_elements") {
      throw InvalidArgument("gradient compression has no parameter '" + key +
                            "'; it takes 'type' (none, 2bit, 1bit, fp16), 'threshold' and "
                            "'min_elements'");
    }
  }
  auto type = params.find("type");
  if (type == params.end()) {
    throw InvalidArgument("gradient compression needs a 'type': none, 2bit, 1bit or fp16");
  }
  CompressionSpec spec;
  if (type->second == "none") {
    spec.type = Compression::kNone;
  } else if (type->second == "2bit") {
    spec.type = Compression::kTwoBit;
  } else if (type->second == "1bit") {
    spec.type = Compression::kOneBit;
  } else if (type->second == "fp16") {
    spec.type = Compression::kFp16;
  } else {
    throw InvalidArgument("unknown gradient compression type '" + type->second +
                          "' (known: none, 2bit, 1bit, fp16)");
  }
  auto threshold = params.find("threshold");
  spec.threshold =
      threshold == params.end() ? DefaultThreshold(spec.type) : ParseThreshold(threshold->second);
  if (auto min = params.find("min_elements"); min != params.end()) {
    spec.min_elements = ParseMinElements(min->second);
  }
  spec.Validate();
  return spec;
}

std::string CompressionSpec::ToString() const {
  std::ostringstream out;
  out << CompressionName(type);
  const bool thresholded = type == Compression::kTwoBit || type == Compression::kOneBit;
  if (thresholded || (enabled() && min_elements > 0)) {
    out << " (";
    if (thresholded) out << "threshold " << threshold;
    if (thresholded && min_elements > 0) out << ", ";
    if (min_elements > 0) out << "keys of " << min_elements << " elements or more";
    out << ")";
  }
  return out.str();
}

size_t CompressedBytes(Compression type, int64_t n) {
  const auto count = static_cast<size_t>(std::max<int64_t>(n, 0));
  switch (type) {
    case Compression::kNone:
      return count * 4;
    case Compression::kTwoBit:
      return static_cast<size_t>(Words(n, kTwoBitPerWord)) * 4;
    case Compression::kOneBit:
      return static_cast<size_t>(Words(n, kOneBitPerWord)) * 4;
    case Compression::kFp16:
      return count * 2;
  }
  return 0;
}

void Compress(const CompressionSpec& spec, const float* grad, float* residual, int64_t n,
              void* out) {
  auto* words = static_cast<uint32_t*>(out);
  switch (spec.type) {
    case Compression::kNone:
      std::memcpy(out, grad, static_cast<size_t>(n) * 4);
      return;
    case Compression::kTwoBit: {
      const int64_t done =
          HasAvx2() ? TwoBitCompressAvx2(grad, residual, n, spec.threshold, words) : 0;
      if (done < n) TwoBitCompressScalar(grad, residual, done, n, spec.threshold, words);
      return;
    }
    case Compression::kOneBit: {
      const int64_t done =
          HasAvx2() ? OneBitCompressAvx2(grad, residual, n, spec.threshold, words) : 0;
      if (done < n) OneBitCompressScalar(grad, residual, done, n, spec.threshold, words);
      return;
    }
    case Compression::kFp16:
      FloatToHalf(grad, static_cast<uint16_t*>(out), static_cast<size_t>(n));
      return;
  }
}

void Decompress(const CompressionSpec& spec, const void* packed, int64_t n, float* out,
                bool accumulate) {
  const auto* words = static_cast<const uint32_t*>(packed);
  switch (spec.type) {
    case Compression::kNone: {
      const auto* values = static_cast<const float*>(packed);
      for (int64_t i = 0; i < n; ++i) out[i] = accumulate ? out[i] + values[i] : values[i];
      return;
    }
    case Compression::kTwoBit: {
      const int64_t done =
          HasAvx2() ? TwoBitDecompressAvx2(words, n, spec.threshold, out, accumulate) : 0;
      if (done < n) TwoBitDecompressScalar(words, done, n, spec.threshold, out, accumulate);
      return;
    }
    case Compression::kOneBit: {
      const int64_t done = HasAvx2() ? OneBitDecompressAvx2(words, n, out, accumulate) : 0;
      if (done < n) OneBitDecompressScalar(words, done, n, out, accumulate);
      return;
    }
    case Compression::kFp16:
      Fp16Decompress(static_cast<const uint16_t*>(packed), n, out, accumulate);
      return;
  }
}

bool WellFormed(Compression type, const void* packed, int64_t n) {
  const auto* words = static_cast<const uint32_t*>(packed);
  if (type == Compression::kTwoBit) {
    const int64_t count = Words(n, kTwoBitPerWord);
    uint32_t bad = 0;
    for (int64_t w = 0; w < count; ++w) bad |= words[w] & (words[w] >> 1) & 0x55555555u;
    const int64_t tail = n % kTwoBitPerWord;
    if (tail != 0) bad |= words[count - 1] >> (2 * tail);  // padding must be zero
    return bad == 0;
  }
  if (type == Compression::kOneBit) {
    const int64_t tail = n % kOneBitPerWord;
    return tail == 0 || (words[Words(n, kOneBitPerWord) - 1] >> tail) == 0;
  }
  return true;
}

}  // namespace dtrain

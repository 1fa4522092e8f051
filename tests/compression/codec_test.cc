// Gradient compression: MXNet's expectations for 2-bit and 1-bit with error feedback, a reference
// quantizer written out element by element (the vectorised paths must match it bit for bit,
// residuals included), slicing at word boundaries, and the checks on untrusted words.
#include "compression/codec.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "common/elementwise.h"
#include "dtrain/common/error.h"

namespace dtrain {
namespace {

// One step of one worker: its gradient in, the values the server decodes out.
std::vector<float> Step(const CompressionSpec& spec, const std::vector<float>& grad,
                        std::vector<float>& residual) {
  const int64_t n = static_cast<int64_t>(grad.size());
  std::vector<char> packed(CompressedBytes(spec.type, n) + 1);
  Compress(spec, grad.data(), residual.data(), n, packed.data());
  std::vector<float> out(grad.size());
  Decompress(spec, packed.data(), n, out.data(), false);
  return out;
}

// The rules of compression/codec.h, one element at a time.
float Reference(const CompressionSpec& spec, float grad, float& residual) {
  float r = residual + grad;
  float sent = 0;
  if (spec.type == Compression::kTwoBit) {
    if (r >= spec.threshold) {
      r -= spec.threshold;
      sent = spec.threshold;
    } else if (r <= -spec.threshold) {
      r += spec.threshold;
      sent = -spec.threshold;
    }
  } else {
    if (r > spec.threshold) {
      r -= 1.0f;
      sent = 1.0f;
    } else {
      r += 1.0f;
      sent = -1.0f;
    }
  }
  residual = r;
  return sent;
}

TEST(GradientCompression, TwoBitFollowsMXNetsExpectations) {
  // Pushes of 0, 0.4, 0.1, 0.2, 0.3, 0.5 with t = 0.5 send 0, 0, t, 0, t, t.
  const CompressionSpec spec{Compression::kTwoBit, 0.5f};
  for (int64_t n : {1, 15, 16, 17, 33, 1000}) {
    std::vector<float> residual(n, 0.0f);
    const float pushes[] = {0.0f, 0.4f, 0.1f, 0.2f, 0.3f, 0.5f};
    const float sent[] = {0.0f, 0.0f, 0.5f, 0.0f, 0.5f, 0.5f};
    for (int step = 0; step < 6; ++step) {
      const auto out = Step(spec, std::vector<float>(n, pushes[step]), residual);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], sent[step]) << n << " " << step << " " << i;
      // Negative gradients mirror it.
    }
    std::vector<float> negative(n, 0.0f);
    EXPECT_EQ(Step(spec, std::vector<float>(n, -0.7f), negative)[n - 1], -0.5f);
  }
}

TEST(GradientCompression, OneBitFollowsMXNetsExpectations) {
  // Pushes of 1, -1, 2, 0, -2 with t = 0 send 1, -1, 1, 1, -1.
  const CompressionSpec spec{Compression::kOneBit, 0.0f};
  for (int64_t n : {1, 31, 32, 33, 100}) {
    std::vector<float> residual(n, 0.0f);
    const float pushes[] = {1, -1, 2, 0, -2};
    const float sent[] = {1, -1, 1, 1, -1};
    for (int step = 0; step < 5; ++step) {
      const auto out = Step(spec, std::vector<float>(n, pushes[step]), residual);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], sent[step]) << n << " " << step << " " << i;
    }
  }
}

TEST(GradientCompression, RandomGradientsMatchTheReferenceBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.6f);
  for (CompressionSpec spec :
       {CompressionSpec{Compression::kTwoBit, 0.5f}, CompressionSpec{Compression::kTwoBit, 0.01f},
        CompressionSpec{Compression::kOneBit, 0.0f}, CompressionSpec{Compression::kOneBit, 0.3f}}) {
    for (int64_t n : {1, 7, 16, 31, 47, 1024, 4099}) {
      SCOPED_TRACE(spec.ToString() + ", " + std::to_string(n) + " values");
      std::vector<float> residual(n, 0.0f), expected_residual(n, 0.0f);
      for (int step = 0; step < 8; ++step) {
        std::vector<float> grad(n);
        for (auto& g : grad) g = normal(rng);
        if (step == 3) grad[n / 2] = -0.0f;  // signed zeros too
        const auto out = Step(spec, grad, residual);
        for (int64_t i = 0; i < n; ++i) {
          const float want = Reference(spec, grad[i], expected_residual[i]);
          ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(want)) << i;
          ASSERT_EQ(std::bit_cast<uint32_t>(residual[i]),
                    std::bit_cast<uint32_t>(expected_residual[i]))
              << i;
        }
      }
    }
  }
}

TEST(GradientCompression, DecompressAccumulatesAsItDecodes) {
  const CompressionSpec spec{Compression::kTwoBit, 0.25f};
  std::vector<float> residual(40, 0.0f), grad(40, 1.0f);
  std::vector<char> packed(CompressedBytes(spec.type, 40));
  Compress(spec, grad.data(), residual.data(), 40, packed.data());
  std::vector<float> sum(40, 2.0f);
  Decompress(spec, packed.data(), 40, sum.data(), /*accumulate=*/true);
  for (float v : sum) EXPECT_EQ(v, 2.25f);
}

TEST(GradientCompression, SlicesAtWholeWordsEqualTheWhole) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  for (Compression type : {Compression::kTwoBit, Compression::kOneBit, Compression::kFp16}) {
    const CompressionSpec spec{type, CompressionSpec::DefaultThreshold(type)};
    const int64_t n = 32 * 7 + 5;
    std::vector<float> grad(n);
    for (auto& g : grad) g = uniform(rng);
    std::vector<float> r_whole(n, 0.0f), r_parts(n, 0.0f);
    std::vector<char> whole(CompressedBytes(type, n));
    Compress(spec, grad.data(), r_whole.data(), n, whole.data());
    // Slots of 96 and 64 elements and the rest, as a key partition cuts them.
    std::vector<char> parts;
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 96}, {96, 160}, {160, n}}) {
      std::vector<char> piece(CompressedBytes(type, end - begin));
      Compress(spec, grad.data() + begin, r_parts.data() + begin, end - begin, piece.data());
      ASSERT_EQ(CompressedBytes(type, begin), parts.size());
      parts.insert(parts.end(), piece.begin(), piece.end());
    }
    EXPECT_EQ(parts, whole) << CompressionName(type);
    EXPECT_EQ(r_parts, r_whole);
  }
}

TEST(GradientCompression, Fp16IsARoundingToHalfPrecision) {
  const CompressionSpec spec{Compression::kFp16, 0.0f};
  std::vector<float> grad = {1.0f, -2.5f, 0.1f, 65504.0f, 1e-8f};
  std::vector<float> residual;  // not used
  const auto out = Step(spec, grad, residual);
  for (size_t i = 0; i < grad.size(); ++i) EXPECT_EQ(out[i], HalfToFloat(FloatToHalf(grad[i])));
  EXPECT_EQ(CompressedBytes(Compression::kFp16, 5), 10u);
}

TEST(GradientCompression, SizesAreWholeWords) {
  EXPECT_EQ(CompressedBytes(Compression::kTwoBit, 1), 4u);
  EXPECT_EQ(CompressedBytes(Compression::kTwoBit, 16), 4u);
  EXPECT_EQ(CompressedBytes(Compression::kTwoBit, 17), 8u);
  EXPECT_EQ(CompressedBytes(Compression::kOneBit, 32), 4u);
  EXPECT_EQ(CompressedBytes(Compression::kOneBit, 33), 8u);
  EXPECT_EQ(CompressedBytes(Compression::kNone, 3), 12u);
  // 16 MB of float32 as 2-bit codes: 1 MB, a sixteenth.
  EXPECT_EQ(CompressedBytes(Compression::kTwoBit, 4 << 20), size_t{1} << 20);
}

TEST(GradientCompression, WordsFromTheNetworkAreChecked) {
  uint32_t words[2] = {0, 0};
  EXPECT_TRUE(WellFormed(Compression::kTwoBit, words, 20));
  words[0] = 3u << 6;  // value 3 holds the unused code 11
  EXPECT_FALSE(WellFormed(Compression::kTwoBit, words, 20));
  words[0] = 0x55555555u;  // every value +t
  words[1] = 1u << 8;      // value 20 of 20: padding
  EXPECT_FALSE(WellFormed(Compression::kTwoBit, words, 20));
  words[1] = 1u << 6;  // value 19: fine
  EXPECT_TRUE(WellFormed(Compression::kTwoBit, words, 20));
  uint32_t bits[2] = {0xffffffffu, 1u << 2};
  EXPECT_FALSE(WellFormed(Compression::kOneBit, bits, 34));  // bit 34 is padding
  bits[1] = 3u;
  EXPECT_TRUE(WellFormed(Compression::kOneBit, bits, 34));
}

TEST(GradientCompression, ParametersAreMXNetsAndBadOnesAreClearErrors) {
  auto spec = CompressionSpec::FromParams({{"type", "2bit"}});
  EXPECT_EQ(spec.type, Compression::kTwoBit);
  EXPECT_EQ(spec.threshold, 0.5f);  // MXNet's default
  spec = CompressionSpec::FromParams({{"type", "1bit"}, {"threshold", "0"}});
  EXPECT_EQ(spec.type, Compression::kOneBit);
  EXPECT_FALSE(CompressionSpec::FromParams({{"type", "none"}}).enabled());
  EXPECT_EQ(CompressionSpec::FromParams({{"type", "fp16"}}).type, Compression::kFp16);
  EXPECT_TRUE(spec.AppliesTo(1));  // MXNet compresses every key
  spec = CompressionSpec::FromParams({{"type", "2bit"}, {"min_elements", "4096"}});
  EXPECT_EQ(spec.min_elements, 4096);
  EXPECT_FALSE(spec.AppliesTo(4095));
  EXPECT_TRUE(spec.AppliesTo(4096));
  EXPECT_EQ(spec.ToString(), "2bit (threshold 0.5, keys of 4096 elements or more)");
  EXPECT_FALSE(CompressionSpec::FromParams({{"type", "none"}, {"min_elements", "1"}}).AppliesTo(9));
  for (const auto& bad : std::vector<std::map<std::string, std::string>>{
           {},
           {{"type", "3bit"}},
           {{"type", "2bit"}, {"threshold", "0"}},
           {{"type", "2bit"}, {"threshold", "-1"}},
           {{"type", "2bit"}, {"threshold", "nan"}},
           {{"type", "2bit"}, {"threshold", "0.5x"}},
           {{"type", "1bit"}, {"threshold", "-0.1"}},
           {{"type", "fp16"}, {"threshold", "0.5"}},
           {{"type", "2bit"}, {"treshold", "0.5"}},
           {{"type", "2bit"}, {"min_elements", "-1"}},
           {{"type", "2bit"}, {"min_elements", "4k"}},
           {{"type", "2bit"}, {"min_elements", "1.5"}},
           {{"type", "2bit"}, {"min_elements", " 16"}},
           {{"type", "2bit"}, {"min_elements", "+16"}},
           {{"type", "2bit"}, {"min_elements", ""}},
           {{"type", "2bit"}, {"min_elements", "99999999999999999999999"}},
       }) {
    EXPECT_THROW(CompressionSpec::FromParams(bad), InvalidArgument);
  }
}

}  // namespace
}  // namespace dtrain

#include "common/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace dtrain {
namespace {

TEST(Elementwise, CopyBypassingCachesCopiesEveryByteAtAnyAlignmentAndLength) {
  std::vector<unsigned char> in(4096 + 64), out(4096 + 64);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t from : {0u, 1u, 15u, 16u, 33u}) {
    for (size_t to : {0u, 3u, 16u, 63u}) {
      for (size_t bytes : {0u, 1u, 15u, 16u, 17u, 63u, 64u, 65u, 200u, 4000u}) {
        std::fill(out.begin(), out.end(), 0xee);
        CopyBypassingCaches(out.data() + to, in.data() + from, bytes);
        for (size_t i = 0; i < out.size(); ++i) {
          const bool inside = i >= to && i < to + bytes;
          ASSERT_EQ(out[i], inside ? in[from + i - to] : 0xee)
              << "from " << from << " to " << to << " bytes " << bytes << " at " << i;
        }
      }
    }
  }
}

TEST(Elementwise, EveryHalfSurvivesARoundTripThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h << " = " << f;
  }
}

TEST(Elementwise, FloatToHalfRoundsToNearestEven) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f)), 1.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(65520.0f))));  // the tie rounds up to infinity
  EXPECT_EQ(HalfToFloat(FloatToHalf(65519.0f)), 65504.0f);
  // 2049 lies halfway between the halves 2048 and 2050: even mantissa wins (2048).
  EXPECT_EQ(HalfToFloat(FloatToHalf(2049.0f)), 2048.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(2051.0f)), 2052.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(5.9604645e-8f)), 5.9604645e-8f);  // smallest subnormal
  EXPECT_EQ(HalfToFloat(FloatToHalf(2e-8f)), 0.0f);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(Elementwise, VectorConversionsMatchTheScalarOnes) {
  // The vector path may use F16C; it must agree bit for bit with the software path.
  std::mt19937 random(7);
  std::vector<float> in(1027);
  for (auto& f : in) {
    uint32_t bits = random();
    f = std::bit_cast<float>(bits);
    if (std::isnan(f)) f = 1.5f;
  }
  in[0] = 65520.0f;
  in[1] = 1e-7f;
  std::vector<uint16_t> half(in.size());
  FloatToHalf(in.data(), half.data(), in.size());
  std::vector<float> back(in.size());
  HalfToFloat(half.data(), back.data(), half.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(half[i], FloatToHalf(in[i])) << in[i];
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(HalfToFloat(half[i])));
  }
}

TEST(Elementwise, SumsEveryDType) {
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30}, f(3);
  Sum(f.data(), a.data(), b.data(), 3, DType::kFloat32);
  EXPECT_EQ(f, (std::vector<float>{11, 22, 33}));

  std::vector<double> x = {0.5, 1.5}, y = {0.25, 2};
  Sum(x.data(), x.data(), y.data(), 2, DType::kFloat64);  // in place
  EXPECT_EQ(x, (std::vector<double>{0.75, 3.5}));

  std::vector<uint16_t> h(9), k(9), out(9);
  for (int i = 0; i < 9; ++i) {
    h[i] = FloatToHalf(static_cast<float>(i));
    k[i] = FloatToHalf(static_cast<float>(100 * i));
  }
  Sum(out.data(), h.data(), k.data(), 9, DType::kFloat16);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(HalfToFloat(out[i]), 101.0f * i);

  // bfloat16 is the top half of a float32.
  auto bf = [](float v) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16); };
  std::vector<uint16_t> p = {bf(1.0f), bf(-2.0f)}, q = {bf(3.0f), bf(0.5f)}, r(2);
  Sum(r.data(), p.data(), q.data(), 2, DType::kBFloat16);
  EXPECT_EQ(r[0], bf(4.0f));
  EXPECT_EQ(r[1], bf(-1.5f));
}

TEST(Elementwise, MinMaxAndProductOfEveryDTypePropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = {1, -2, nan, 4}, b = {3, -5, 0, nan}, out(4);
  Reduce(out.data(), a.data(), b.data(), 4, DType::kFloat32, Reduction::kMin);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], -5);
  EXPECT_TRUE(std::isnan(out[2]) && std::isnan(out[3]));
  Reduce(out.data(), a.data(), b.data(), 4, DType::kFloat32, Reduction::kMax);
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], -2);
  EXPECT_TRUE(std::isnan(out[2]) && std::isnan(out[3]));
  Reduce(out.data(), a.data(), b.data(), 2, DType::kFloat32, Reduction::kProduct);
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], 10);

  std::vector<double> x = {0.5, 7}, y = {0.25, -7};
  Reduce(x.data(), x.data(), y.data(), 2, DType::kFloat64, Reduction::kMax);  // in place
  EXPECT_EQ(x, (std::vector<double>{0.5, 7}));

  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    // 1.5 and -3 are exact in both half types; the identity leaves them alone.
    std::vector<float> wide = {1.5f, -3.0f};
    std::vector<uint16_t> h(2), identity(2), r(2);
    if (half == DType::kFloat16) {
      FloatToHalf(wide.data(), h.data(), 2);
    } else {
      for (int i = 0; i < 2; ++i)
        h[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(wide[i]) >> 16);
    }
    for (Reduction how : {Reduction::kSum, Reduction::kMin, Reduction::kMax, Reduction::kProduct}) {
      FillIdentity(identity.data(), 2, half, how);
      Reduce(r.data(), identity.data(), h.data(), 2, half, how);
      EXPECT_EQ(r, h) << "dtype " << DTypeName(half) << ", reduction " << static_cast<int>(how);
    }
  }
}

TEST(Elementwise, IdentitiesLeaveEveryValueUnchanged) {
  std::vector<float> values = {-1e30f, -2.5f, 0.0f, 3.0f, 1e30f};
  for (Reduction how : {Reduction::kSum, Reduction::kMin, Reduction::kMax, Reduction::kProduct}) {
    std::vector<float> identity(values.size()), out(values.size());
    FillIdentity(identity.data(), identity.size(), DType::kFloat32, how);
    Reduce(out.data(), values.data(), identity.data(), values.size(), DType::kFloat32, how);
    EXPECT_EQ(out, values) << "reduction " << static_cast<int>(how);
    std::vector<double> wide(values.begin(), values.end()), wide_identity(values.size());
    FillIdentity(wide_identity.data(), wide.size(), DType::kFloat64, how);
    Reduce(wide_identity.data(), wide_identity.data(), wide.data(), wide.size(), DType::kFloat64,
           how);
    EXPECT_EQ(wide_identity, wide) << "reduction " << static_cast<int>(how);
  }
}

TEST(Elementwise, ScaleTurnsASumIntoAnAverage) {
  std::vector<float> f = {3, 6, 9};
  Scale(f.data(), f.size(), DType::kFloat32, 1.0 / 3);
  EXPECT_EQ(f, (std::vector<float>{1, 2, 3}));
  std::vector<uint16_t> h = {FloatToHalf(8.0f)};
  Scale(h.data(), 1, DType::kFloat16, 0.25);
  EXPECT_EQ(HalfToFloat(h[0]), 2.0f);
}

}  // namespace
}  // namespace dtrain

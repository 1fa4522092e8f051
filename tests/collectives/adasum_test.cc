// Adasum's pairwise combination (adasum.h) on known cases: orthogonal gradients add up, parallel
// ones average, a zero gradient leaves the other as it is, and each tensor of a fused buffer gets
// its own coefficients.
#include "collectives/adasum.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/elementwise.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

template <typename T>
std::vector<T> Combined(const std::vector<T>& a, const std::vector<T>& b,
                        const std::vector<size_t>& counts, DType dtype) {
  std::vector<T> out(a.size());
  AdasumCombine(a.data(), b.data(), out.data(), counts, dtype);
  return out;
}

TEST(Adasum, OrthogonalGradientsAddUpAndParallelOnesAverage) {
  const std::vector<float> x = {3, 0, 0, 0}, y = {0, -2, 0, 0};
  EXPECT_EQ(Combined(x, y, {4}, DType::kFloat32), (std::vector<float>{3, -2, 0, 0}));
  // b = 3a: (1 - 3/2) a + (1 - 1/6) 3a = 2a, the mean of a and 3a.
  const std::vector<double> a = {1, -2, 0.5}, b = {3, -6, 1.5};
  const std::vector<double> got = Combined(a, b, {3}, DType::kFloat64);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(got[i], 2 * a[i], 1e-12) << i;
}

TEST(Adasum, AZeroGradientLeavesTheOtherUnchanged) {
  const std::vector<float> g = {1.5f, -4, 2}, zero = {0, 0, 0};
  EXPECT_EQ(Combined(g, zero, {3}, DType::kFloat32), g);
  EXPECT_EQ(Combined(zero, g, {3}, DType::kFloat32), g);
  EXPECT_EQ(Combined(zero, zero, {3}, DType::kFloat32), zero);
}

TEST(Adasum, GradientsNearTheSmallestFloatStillAverage) {
  // Squared norms of about 1e-74: far from zero in float64, where they are accumulated.
  const float tiny = 1.2e-38f;
  const std::vector<float> a(64, tiny), b(64, 3 * tiny);
  for (float v : Combined(a, b, {64}, DType::kFloat32)) EXPECT_FLOAT_EQ(v, 2 * tiny);
}

TEST(Adasum, EachTensorOfAFusedBufferHasItsOwnCoefficients) {
  // Tensor 1 (3 values): parallel, averaged. Tensor 2 (2 values): orthogonal, summed. Over the
  // whole buffer the two would share one pair of coefficients and neither would come out right.
  const std::vector<float> a = {1, 2, 3, 5, 0};
  const std::vector<float> b = {3, 6, 9, 0, 7};
  const std::vector<float> got = Combined(a, b, {3, 2}, DType::kFloat32);
  const std::vector<float> want = {2, 4, 6, 5, 7};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
}

TEST(Adasum, Float16IsCombinedInFloat32AndRoundedOnce) {
  std::vector<uint16_t> a, b;
  for (float v : {1.0f, 2.0f, -0.5f}) {
    a.push_back(FloatToHalf(v));
    b.push_back(FloatToHalf(3 * v));
  }
  const std::vector<uint16_t> got = Combined(a, b, {3}, DType::kFloat16);
  EXPECT_EQ(HalfToFloat(got[0]), 2.0f);
  EXPECT_EQ(HalfToFloat(got[1]), 4.0f);
  EXPECT_EQ(HalfToFloat(got[2]), -1.0f);
}

TEST(Adasum, OnlyHorovodsFloatTypesAndPowersOfTwo) {
  EXPECT_TRUE(AdasumTakes(DType::kFloat16));
  EXPECT_FALSE(AdasumTakes(DType::kBFloat16));
  std::vector<uint16_t> v(2);
  EXPECT_THROW(AdasumCombine(v.data(), v.data(), v.data(), {2}, DType::kBFloat16), InvalidArgument);
  for (int n : {1, 2, 4, 64}) EXPECT_TRUE(IsPowerOfTwo(n)) << n;
  for (int n : {0, 3, 6, -4}) EXPECT_FALSE(IsPowerOfTwo(n)) << n;
}

}  // namespace
}  // namespace dtrain::collectives

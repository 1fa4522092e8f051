// Array: shapes, construction, shared and deep copies, and the summing kernel.
#include "dtrain/common/array.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/elementwise.h"
#include "dtrain/common/error.h"

namespace dtrain {
namespace {

TEST(ArrayTest, ShapeHelpers) {
  EXPECT_EQ(NumElements({}), 1);  // a scalar
  EXPECT_EQ(NumElements({0}), 0);
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(NumElements({5, 0, 7}), 0);
  EXPECT_THROW(NumElements({2, -1}), InvalidArgument);
  EXPECT_EQ(ShapeToString({}), "()");
  EXPECT_EQ(ShapeToString({3}), "(3,)");
  EXPECT_EQ(ShapeToString({2, 3}), "(2,3)");
}

TEST(ArrayTest, NewArraysAreZeroFilledAndAligned) {
  const Array a({2, 3});
  EXPECT_TRUE(a.defined());
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(a.size(), 6);
  EXPECT_EQ(a.dtype(), DType::kFloat32);
  EXPECT_EQ(a.nbytes(), 24u);
  EXPECT_EQ(a.ToVector(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);

  const Array d({4}, DType::kFloat64);
  EXPECT_EQ(d.nbytes(), 32u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(static_cast<double*>(d.data())[i], 0.0);
  EXPECT_EQ(Array({3}, DType::kFloat16).nbytes(), 6u);
  EXPECT_EQ(Array({3}, DType::kBFloat16).nbytes(), 6u);
  EXPECT_THROW(Array({-3}), InvalidArgument);
}

TEST(ArrayTest, DefaultArrayIsUndefined) {
  const Array a;
  EXPECT_FALSE(a.defined());
  EXPECT_EQ(a.size(), 0);
  EXPECT_EQ(a.nbytes(), 0u);
}

TEST(ArrayTest, FromFloats) {
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const Array flat = Array::FromFloats(values);
  EXPECT_EQ(flat.shape(), (Shape{6}));
  EXPECT_EQ(flat.ToVector(), values);
  EXPECT_NE(flat.data(), values.data());  // copied

  const Array matrix = Array::FromFloats(values, {2, 3});
  EXPECT_EQ(matrix.shape(), (Shape{2, 3}));
  EXPECT_EQ(matrix.floats()[4], 5.0f);

  try {
    Array::FromFloats(values, {4, 2});
    FAIL() << "a (4,2) shape took 6 values";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("(4,2)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("6"), std::string::npos) << e.what();
  }
  EXPECT_EQ(Array::FromFloats({}).size(), 0);
}

TEST(ArrayTest, CopiesShareMemory) {
  const Array a = Array::FromFloats(std::vector<float>{1, 2, 3});
  const Array b = a;  // NOLINT: a copy on purpose
  b.floats()[1] = 20;
  EXPECT_EQ(a.ToVector(), (std::vector<float>{1, 20, 3}));
  EXPECT_EQ(a.data(), b.data());
}

TEST(ArrayTest, CloneIsDeep) {
  const Array a = Array::FromFloats(std::vector<float>{1, 2, 3, 4}, {2, 2});
  const Array c = a.Clone();
  EXPECT_NE(c.data(), a.data());
  EXPECT_EQ(c.shape(), a.shape());
  EXPECT_EQ(c.dtype(), a.dtype());
  EXPECT_EQ(c.ToVector(), a.ToVector());
  c.floats()[0] = -1;
  EXPECT_EQ(a.floats()[0], 1.0f);

  const Array d({3}, DType::kFloat64);
  static_cast<double*>(d.data())[2] = 2.5;
  const Array dc = d.Clone();
  EXPECT_EQ(dc.dtype(), DType::kFloat64);
  EXPECT_EQ(static_cast<double*>(dc.data())[2], 2.5);

  const Array empty({0});
  EXPECT_EQ(empty.Clone().size(), 0);
}

TEST(ArrayTest, CopyFrom) {
  const Array dst({2, 2});
  dst.CopyFrom(Array::FromFloats(std::vector<float>{1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(dst.ToVector(), (std::vector<float>{1, 2, 3, 4}));
  // Only the number of elements has to match, not the shape.
  dst.CopyFrom(Array::FromFloats(std::vector<float>{5, 6, 7, 8}));
  EXPECT_EQ(dst.ToVector(), (std::vector<float>{5, 6, 7, 8}));
  dst.CopyFrom(dst);  // onto itself: nothing to do
  EXPECT_EQ(dst.ToVector(), (std::vector<float>{5, 6, 7, 8}));
}

TEST(ArrayTest, CopyFromMismatchNamesBothArrays) {
  const Array dst({2, 2});
  try {
    dst.CopyFrom(Array({3}));
    FAIL() << "copied 3 values into 4";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("(3,)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(2,2)"), std::string::npos) << e.what();
  }
  try {
    dst.CopyFrom(Array({2, 2}, DType::kFloat64));
    FAIL() << "copied float64 into float32";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dst.ToVector(), std::vector<float>(4, 0.0f));  // untouched
}

TEST(ArrayTest, FloatViewsNeedFloat32) {
  const Array d({2}, DType::kFloat64);
  EXPECT_THROW(d.floats(), InvalidArgument);
  EXPECT_THROW(d.ToVector(), InvalidArgument);
  EXPECT_THROW(d.Fill(1.0f), InvalidArgument);
  const Array f({3});
  f.Fill(7.0f);
  EXPECT_EQ(f.ToVector(), std::vector<float>(3, 7.0f));
}

TEST(ArrayTest, WrapKeepsTheOwnerAlive) {
  auto storage = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> watch = storage;
  {
    const Array a = Array::Wrap(storage->data(), {3, 2}, DType::kFloat32, storage);
    storage.reset();
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(a.size(), 6);
    EXPECT_EQ(a.floats()[5], 6.0f);
    a.floats()[0] = 10;  // writes go to the wrapped memory
    EXPECT_EQ(watch.lock()->at(0), 10.0f);
  }
  EXPECT_TRUE(watch.expired());
}

TEST(ArrayTest, AddIntoFloat32) {
  std::vector<float> dst = {1, 2, 3, 4, 5};
  const std::vector<float> src = {10, 20, 30, 40, 50};
  AddInto(dst.data(), src.data(), 5, DType::kFloat32);
  EXPECT_EQ(dst, (std::vector<float>{11, 22, 33, 44, 55}));
  AddInto(dst.data(), src.data(), 2, DType::kFloat32);  // only n elements
  EXPECT_EQ(dst, (std::vector<float>{21, 42, 33, 44, 55}));
  AddInto(dst.data(), src.data(), 0, DType::kFloat32);
  EXPECT_EQ(dst[0], 21.0f);
}

TEST(ArrayTest, AddIntoFloat64) {
  std::vector<double> dst = {0.5, 1e300, -2};
  const std::vector<double> src = {0.25, 1e300, 2};
  AddInto(dst.data(), src.data(), 3, DType::kFloat64);
  EXPECT_EQ(dst, (std::vector<double>{0.75, 2e300, 0}));  // 2e300 overflows a float, not a double
}

TEST(ArrayTest, AddIntoSumsHalfPrecisionThroughFloat) {
  std::vector<uint16_t> dst(4, FloatToHalf(1.5f)), src(4, FloatToHalf(2.25f));
  AddInto(dst.data(), src.data(), 4, DType::kFloat16);
  for (uint16_t h : dst) EXPECT_EQ(HalfToFloat(h), 3.75f);
  // bfloat16 is float32's top half: 1.5 is 0x3fc0, 2.25 is 0x4010, 3.75 is 0x4070.
  std::vector<uint16_t> bd(3, 0x3fc0), bs(3, 0x4010);
  AddInto(bd.data(), bs.data(), 3, DType::kBFloat16);
  for (uint16_t h : bd) EXPECT_EQ(h, 0x4070);
}

}  // namespace
}  // namespace dtrain

// src/cuda on a real GPU: staging copies and sums give exactly the host's results. Skipped, with
// the reason, where no CUDA device is usable (CI has the toolkit but no GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/elementwise.h"
#include "cuda/cuda.h"
#include "cuda/pinned_pool.h"
#include "dtrain/common/error.h"

namespace dtrain::cuda {
namespace {

class DeviceArraysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "needs a CUDA GPU: " << Unavailable();
  }

  // A device array holding `host`'s bytes (freed with the array).
  static Array OnDevice(const Array& host, int device = 0) {
    cudaSetDevice(device);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, host.nbytes() ? host.nbytes() : 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    std::shared_ptr<void> owner(p, [](void* q) { cudaFree(q); });
    return Array::WrapDevice(p, host.shape(), host.dtype(), device, nullptr, owner);
  }

  static Array Floats(std::vector<float> v) { return Array::FromFloats(v); }

  // Element i of `a` set to x in a's dtype (bfloat16 truncated: any bfloat16 value will do).
  static void SetElement(const Array& a, int64_t i, float x) {
    switch (a.dtype()) {
      case DType::kFloat32:
        static_cast<float*>(a.data())[i] = x;
        break;
      case DType::kFloat64:
        static_cast<double*>(a.data())[i] = x;
        break;
      case DType::kFloat16:
        static_cast<uint16_t*>(a.data())[i] = FloatToHalf(x);
        break;
      case DType::kBFloat16: {
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        static_cast<uint16_t*>(a.data())[i] = static_cast<uint16_t>(bits >> 16);
        break;
      }
    }
  }
};

TEST_F(DeviceArraysTest, RoundTripThroughPinnedMemory) {
  Array host = Floats({1.5f, -2.f, 3.25f, 0.f});
  Array device = OnDevice(host);
  Array back = ToHost(device);
  EXPECT_FALSE(back.on_device());
  EXPECT_EQ(back.ToVector(), host.ToVector());

  Array other = Floats({9.f, 8.f, 7.f, 6.f});
  CopyFromHost(other, {device});
  EXPECT_EQ(ToHost(device).ToVector(), other.ToVector());
}

TEST_F(DeviceArraysTest, SumsEqualTheHostsForEveryDtype) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const int64_t n = 100003;  // not a multiple of any block size
    Array a(Shape{n}, dtype), b(Shape{n}, dtype);
    for (int64_t i = 0; i < n; ++i) {
      // Values whose sums round in float16/bfloat16, so that one rounding more would show.
      const float x = 0.1f * static_cast<float>(i % 977) - 37.3f;
      const float y = 1.0f / static_cast<float>(1 + i % 31);
      SetElement(a, i, x);
      SetElement(b, i, y);
    }
    Array expected = a.Clone();
    dtrain::AddInto(expected.data(), b.data(), n, dtype);

    Array da = OnDevice(a), db = OnDevice(b);
    AddInto(da, db);
    Array got = ToHost(da);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), expected.nbytes()), 0)
        << "dtype " << DTypeName(dtype);
  }
}

TEST_F(DeviceArraysTest, CloneIsIndependent) {
  Array d = OnDevice(Floats({1.f, 2.f}));
  Array c = CloneOnDevice(d);
  AddInto(c, d);
  EXPECT_EQ(ToHost(c).ToVector(), (std::vector<float>{2.f, 4.f}));
  EXPECT_EQ(ToHost(d).ToVector(), (std::vector<float>{1.f, 2.f}));
}

TEST_F(DeviceArraysTest, MismatchedSumIsRefused) {
  Array a = OnDevice(Floats({1.f, 2.f})), b = OnDevice(Floats({1.f}));
  EXPECT_THROW(AddInto(a, b), InvalidArgument);
}

TEST_F(DeviceArraysTest, PinnedBuffersAreReused) {
  const size_t before = PinnedPool::Default().cached_bytes();
  { Array h = ToHost(OnDevice(Array(Shape{1 << 20}))); }
  const size_t cached = PinnedPool::Default().cached_bytes();
  EXPECT_GE(cached, before + (size_t{4} << 20));
  { Array h = ToHost(OnDevice(Array(Shape{1 << 20}))); }
  EXPECT_EQ(PinnedPool::Default().cached_bytes(), cached);
}

// A push started in autograd's hook returns before the copy has run, and the producer may then
// overwrite its gradient at once: the staged value must be the one it had when the push started.
TEST_F(DeviceArraysTest, StartedCopiesToTheHostKeepTheValueAtTheStart) {
  cudaStream_t producer = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  const int64_t n = 16 << 20;  // 64 MB: copies long enough for a missing order to show
  Array host(Shape{n});
  for (int64_t i = 0; i < n; ++i) host.floats()[i] = static_cast<float>(i % 1000);
  Array value = OnDevice(host);
  Array on_stream = Array::WrapDevice(value.data(), value.shape(), value.dtype(), 0, producer,
                                      std::shared_ptr<void>(value.data(), [value](void*) {}));
  // Work the producer queued before (a busy stream), then the start, then its overwrite.
  void* busy = nullptr;
  ASSERT_EQ(cudaMalloc(&busy, size_t{1} << 30), cudaSuccess);
  for (int i = 0; i < 8; ++i) cudaMemsetAsync(busy, i, size_t{1} << 30, producer);
  Staged staged = StartToHost({on_stream});
  ASSERT_EQ(cudaMemsetAsync(value.data(), 0, value.nbytes(), producer), cudaSuccess);
  staged.copied.Wait("the test's copy");
  ASSERT_EQ(staged.hosts.size(), 1u);
  EXPECT_EQ(std::memcmp(staged.hosts[0].data(), host.data(), host.nbytes()), 0);
  ASSERT_EQ(cudaStreamSynchronize(producer), cudaSuccess);
  EXPECT_EQ(ToHost(value).floats()[999], 0.f);  // the overwrite happened too
  cudaFree(busy);
  cudaStreamDestroy(producer);
}

TEST_F(DeviceArraysTest, StartedSumEqualsTheHostsSum) {
  Array a = Floats({1.f, 2.f, 3.f}), b = Floats({10.f, 20.f, 30.f}), c = Floats({.5f, .25f, 0.f});
  Staged staged = StartSumToHost({OnDevice(a), OnDevice(b), OnDevice(c)});
  staged.copied.Wait("the test's sum");
  ASSERT_EQ(staged.hosts.size(), 1u);
  EXPECT_FALSE(staged.hosts[0].on_device());
  EXPECT_EQ(staged.hosts[0].ToVector(), (std::vector<float>{11.5f, 22.25f, 33.f}));
  EXPECT_THROW(StartSumToHost({OnDevice(a), OnDevice(Floats({1.f}))}), InvalidArgument);
}

TEST_F(DeviceArraysTest, StartedCopiesFromTheHostArriveByTheFence) {
  Array d1 = OnDevice(Floats({0.f, 0.f})), d2 = OnDevice(Floats({0.f, 0.f}));
  Array h = Floats({0.f, 0.f});
  Array from = PinnedLike(h);
  from.floats()[0] = 4.f;
  from.floats()[1] = -1.f;
  Fence fence = StartCopyFromHost(from, {d1, h, d2});
  EXPECT_EQ(h.ToVector(), (std::vector<float>{4.f, -1.f}));  // a host output at once
  fence.Wait("the test's copies");
  EXPECT_EQ(ToHost(d1).ToVector(), (std::vector<float>{4.f, -1.f}));
  EXPECT_EQ(ToHost(d2).ToVector(), (std::vector<float>{4.f, -1.f}));
}

TEST_F(DeviceArraysTest, ACopyInPiecesMarksEachPrefixAndEndsWhole) {
  const int64_t n = 1001;  // 4004 bytes: four pieces of 1000 and one of 4
  Array a({n}), b({n});
  for (int64_t i = 0; i < n; ++i) {
    a.floats()[i] = static_cast<float>(i);
    b.floats()[i] = 0.5f;
  }
  for (bool sum : {false, true}) {
    SCOPED_TRACE(sum ? "sum" : "single value");
    Staged staged =
        sum ? StartSumToHost({OnDevice(a), OnDevice(b)}, 1000) : StartToHost({OnDevice(a)}, 1000);
    ASSERT_EQ(staged.pieces.size(), 5u);
    for (size_t p = 0; p < staged.pieces.size(); ++p) {
      const size_t bytes = staged.pieces[p].bytes;
      EXPECT_EQ(bytes, std::min<size_t>(1000 * (p + 1), 4004));
      staged.pieces[p].copied.Wait("the test's piece");
      for (size_t i = 0; i < bytes / sizeof(float); ++i) {
        ASSERT_EQ(staged.hosts[0].floats()[i], a.floats()[i] + (sum ? 0.5f : 0.f)) << i;
      }
    }
  }
  // One copy where the pieces would be the whole, or where several arrays cross.
  EXPECT_TRUE(StartToHost({OnDevice(a)}, 4004).pieces.empty());
  EXPECT_TRUE(StartToHost({OnDevice(a)}, 0).pieces.empty());
  EXPECT_TRUE(StartToHost({OnDevice(a), OnDevice(b)}, 1000).pieces.empty());
}

TEST_F(DeviceArraysTest, ACopyOfPartOfAHostArrayChangesOnlyThoseBytes) {
  Array d = OnDevice(Floats({0.f, 0.f, 0.f, 0.f})), h = Floats({0.f, 0.f, 0.f, 0.f});
  Array from = PinnedLike(h);
  for (int i = 0; i < 4; ++i) from.floats()[i] = static_cast<float>(i + 1);
  StartCopyFromHost(from, {d, h}, 4, 12).Wait("the test's copies");
  EXPECT_EQ(ToHost(d).ToVector(), (std::vector<float>{0.f, 2.f, 3.f, 0.f}));
  EXPECT_EQ(h.ToVector(), (std::vector<float>{0.f, 2.f, 3.f, 0.f}));
  EXPECT_THROW(StartCopyFromHost(from, {d}, 8, 20), InvalidArgument);
  EXPECT_THROW(StartCopyFromHost(from, {d}, 12, 8), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::cuda

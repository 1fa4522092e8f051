// Gradient compression on a real GPU (compression/kernels/device_codec.h): every codec gives the
// host's words and leaves the host's residual, bit for bit, over several steps of error feedback
// and at sizes around the words' and warps' edges; and through cuda::StartSumToHost with an
// encoder, as the kvstore's staging uses it, several device values are summed and compressed to
// the bits the host gives for their sum. Skipped, with the reason, where no CUDA device is usable
// (CI has the toolkit but no GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression/kernels/device_codec.h"
#include "cuda/cuda.h"
#include "on_gpu_test.h"

namespace dtrain {
namespace {

std::vector<float> Random(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Device memory of `bytes`, written and read synchronously, and a guard of kGuard bytes after it.
constexpr size_t kGuard = 64;
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes + kGuard), cudaSuccess);
    memory_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    EXPECT_EQ(cudaMemset(p, 0, bytes + kGuard), cudaSuccess);
  }
  // Every byte, guard included, set to 0xff: a word the kernel skips, or one past the end, shows.
  void Poison() {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemset(memory_.get(), 0xff, bytes_ + kGuard), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  bool GuardIntact() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<unsigned char> guard(kGuard);
    EXPECT_EQ(cudaMemcpy(guard.data(), static_cast<char*>(memory_.get()) + bytes_, kGuard,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (unsigned char c : guard) {
      if (c != 0xff) return false;
    }
    return true;
  }
  void Set(const void* values) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(memory_.get(), values, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<char> Get() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<char> v(bytes_);
    EXPECT_EQ(cudaMemcpy(v.data(), memory_.get(), bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void* get() const { return memory_.get(); }
  const std::shared_ptr<void>& memory() const { return memory_; }

 private:
  size_t bytes_;
  std::shared_ptr<void> memory_;
};

std::vector<char> Bytes(const void* p, size_t n) {
  const auto* c = static_cast<const char*>(p);
  return std::vector<char>(c, c + n);
}

// The first differing byte, in the message.
::testing::AssertionResult SameBytes(const std::vector<char>& a, const std::vector<char>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return ::testing::AssertionFailure() << "byte " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

std::vector<CompressionSpec> Specs() {
  return {CompressionSpec::FromParams({{"type", "2bit"}, {"threshold", "0.5"}}),
          CompressionSpec::FromParams({{"type", "2bit"}, {"threshold", "1.25"}}),
          CompressionSpec::FromParams({{"type", "1bit"}}),
          CompressionSpec::FromParams({{"type", "1bit"}, {"threshold", "0.3"}}),
          CompressionSpec::FromParams({{"type", "fp16"}})};
}

class CodecOnDeviceTest : public OnGpuTest {};

// Around a 2-bit word (16), a warp and a 1-bit word (32), a block (256), and a grid's round
// (4096 blocks of 256 threads).
const std::vector<size_t> kSizes = {1, 15, 16, 17, 31, 32, 33, 255, 4099, (size_t{1} << 21) + 4099};

TEST_F(CodecOnDeviceTest, EveryCodecMatchesTheHostBitForBitOverSteps) {
  for (const CompressionSpec& spec : Specs()) {
    for (size_t n : kSizes) {
      SCOPED_TRACE(spec.ToString() + ", " + std::to_string(n) + " values");
      std::mt19937 rng(static_cast<uint32_t>(n));
      const size_t packed_bytes = CompressedBytes(spec.type, static_cast<int64_t>(n));
      std::vector<float> host_residual(n, 0.f);
      DeviceBytes grad(n * 4), residual(n * 4), packed(packed_bytes);
      for (int step = 0; step < 4; ++step) {
        const std::vector<float> g = Random(rng, n, 0.6f);
        std::vector<char> want(packed_bytes);
        Compress(spec, g.data(), host_residual.data(), static_cast<int64_t>(n), want.data());
        grad.Set(g.data());
        packed.Poison();
        CompressOnDevice(spec, static_cast<const float*>(grad.get()),
                         static_cast<float*>(residual.get()), static_cast<int64_t>(n), packed.get(),
                         0, stream_);
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        ASSERT_TRUE(SameBytes(packed.Get(), want)) << "words, step " << step;
        ASSERT_TRUE(packed.GuardIntact()) << "a write past the last word, step " << step;
        if (spec.type != Compression::kFp16) {
          ASSERT_TRUE(SameBytes(residual.Get(), Bytes(host_residual.data(), n * 4)))
              << "residual, step " << step;
        }
      }
    }
  }
}

TEST_F(CodecOnDeviceTest, AnEncodedSumOfDeviceValuesIsTheHostsCompressedSum) {
  const size_t n = 100003;
  for (const CompressionSpec& spec : Specs()) {
    SCOPED_TRACE(spec.ToString());
    std::mt19937 rng(11);
    const size_t packed_bytes = CompressedBytes(spec.type, static_cast<int64_t>(n));
    std::vector<float> host_residual(n, 0.f);
    DeviceBytes residual(n * 4);
    std::vector<DeviceBytes> replicas;
    for (int r = 0; r < 3; ++r) replicas.emplace_back(n * 4);
    cuda::DeviceEncoder encoder;
    encoder.shape = {static_cast<int64_t>(packed_bytes / 2)};
    encoder.dtype = DType::kFloat16;
    encoder.encode = [&](const void* sum, void* out, void* stream) {
      CompressOnDevice(spec, static_cast<const float*>(sum), static_cast<float*>(residual.get()),
                       static_cast<int64_t>(n), out, 0, stream);
    };
    for (int step = 0; step < 3; ++step) {
      std::vector<float> sum(n, 0.f);
      std::vector<Array> values;
      for (int r = 0; r < 3; ++r) {
        const std::vector<float> v = Random(rng, n, 0.4f);
        for (size_t i = 0; i < n; ++i) sum[i] = r == 0 ? v[i] : sum[i] + v[i];
        replicas[r].Set(v.data());
        values.push_back(Array::WrapDevice(replicas[r].get(), Shape{static_cast<int64_t>(n)},
                                           DType::kFloat32, 0, stream_, replicas[r].memory()));
      }
      std::vector<char> want(packed_bytes);
      Compress(spec, sum.data(), host_residual.data(), static_cast<int64_t>(n), want.data());
      cuda::Staged staged = cuda::StartSumToHost(values, encoder);
      staged.copied.Wait("the test's encoded sum");
      ASSERT_EQ(staged.hosts.size(), 1u);
      ASSERT_EQ(staged.hosts[0].nbytes(), packed_bytes);
      ASSERT_TRUE(SameBytes(Bytes(staged.hosts[0].data(), packed_bytes), want)) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace dtrain

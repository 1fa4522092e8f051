// Gradient compression in a "device" store of CUDA values on a real GPU: each value is compressed
// on its own GPU (as MXNet's device store quantizes each GPU's gradient there) and only the
// compressed bytes reach the store, which gives, round after round, exactly the sums and updates
// the same calls on host values give. Skipped, with the reason, where no CUDA device is usable (CI
// has the toolkit but no GPU).
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "cuda/cuda.h"
#include "dtrain/common/error.h"
#include "dtrain/kvstore/kvstore.h"
#include "kvstore/device_staging_kvstore.h"
#include "kvstore/local_kvstore.h"
#include "on_gpu_test.h"

namespace dtrain {
namespace {

constexpr Key kKey = 3;
constexpr int64_t kSize = 3001;  // not a multiple of a word or of any kernel's block

std::vector<float> Random(std::mt19937& rng, float scale) {
  return RandomVector(rng, kSize, scale);
}

class DeviceStoreCompressionTest : public OnGpuTest {
 protected:
  Array On(int device, const std::vector<float>& values) const {
    const Array a = cuda::NewOnDevice(device, Shape{kSize}, DType::kFloat32, values.data());
    // Named as produced on the test's stream where that is the device's (device 0).
    return device == 0 ? Array::WrapDevice(a.data(), a.shape(), a.dtype(), 0, stream_, a.owner())
                       : a;
  }

  // A store as KVStore::Create makes a "device" one where CUDA is built in, for CUDA values, and
  // one for the same calls on host values, both compressing with `params`.
  static std::pair<std::unique_ptr<KVStore>, std::unique_ptr<KVStore>> Stores(
      const std::map<std::string, std::string>& params, const std::vector<float>& weight,
      bool optimizer) {
    std::unique_ptr<KVStore> gpu =
        std::make_unique<DeviceStagingKVStore>(std::make_unique<LocalKVStore>("device"));
    std::unique_ptr<KVStore> host = std::make_unique<LocalKVStore>("device");
    for (KVStore* kv : {gpu.get(), host.get()}) {
      kv->SetGradientCompression(params);
      if (optimizer) kv->SetOptimizer({"adam", {{"learning_rate", 0.01}}});
      kv->Init(kKey, Array::FromFloats(weight));
    }
    return {std::move(gpu), std::move(host)};
  }
};

TEST_F(DeviceStoreCompressionTest, EachGpuValueCompressedThereGivesTheHostPathsBits) {
  for (const char* type : {"2bit", "1bit", "fp16"}) {
    for (bool optimizer : {false, true}) {
      SCOPED_TRACE(std::string(type) + (optimizer ? " with adam" : " without an optimizer"));
      std::mt19937 rng(11);
      auto [gpu, host] = Stores({{"type", type}}, Random(rng, 1.f), optimizer);
      for (int round = 0; round < 4; ++round) {
        const std::vector<float> a = Random(rng, 0.5f), b = Random(rng, 0.5f);
        const Array out_a = On(0, std::vector<float>(kSize)), out_b = On(0, a);
        const Array expected = Array::FromFloats(std::vector<float>(kSize));
        if (round % 2 == 0) {
          gpu->PushPull(kKey, {On(0, a), On(0, b)}, {out_a, out_b}).Wait();
          host->PushPull(kKey, {Array::FromFloats(a), Array::FromFloats(b)}, {expected}).Wait();
        } else {
          gpu->Push(kKey, {On(0, a), On(0, b)});
          gpu->Pull(kKey, {out_a, out_b}).Wait();
          host->Push(kKey, {Array::FromFloats(a), Array::FromFloats(b)}).Wait();
          host->Pull(kKey, {expected}).Wait();
        }
        ASSERT_TRUE(SameBits(Read(out_a), Read(expected))) << "round " << round;
        ASSERT_TRUE(SameBits(Read(out_b), Read(expected))) << "round " << round;
      }
    }
  }
}

TEST_F(DeviceStoreCompressionTest, TheResidualsOfCudaValuesStayOnTheGpu) {
  auto stores = Stores({{"type", "2bit"}, {"threshold", "0.5"}}, std::vector<float>(kSize),
                       /*optimizer=*/false);
  KVStore* gpu = stores.first.get();
  const std::vector<float> a(kSize, 0.4f), b(kSize, 0.3f);
  auto pulled = [gpu] {
    const Array out = Array::FromFloats(std::vector<float>(kSize, -1.f));
    gpu->Pull(kKey, {out}).Wait();
    return out.ToVector();
  };
  // Nothing crosses at first: 0.4 and 0.3 stay behind, each in its value's residual on the GPU.
  gpu->Push(kKey, {On(0, a), On(0, b)});
  EXPECT_EQ(pulled(), std::vector<float>(kSize, 0.f));
  // Host values use the store's own residuals, which the GPU's pushes left at zero: had those been
  // compressed on the host, 0.8 and 0.6 would each have sent 0.5 here.
  gpu->Push(kKey, {Array::FromFloats(a), Array::FromFloats(b)});
  EXPECT_EQ(pulled(), std::vector<float>(kSize, 0.f));
  gpu->Push(kKey, {On(0, a), On(0, b)});
  EXPECT_EQ(pulled(), std::vector<float>(kSize, 1.f));
}

TEST_F(DeviceStoreCompressionTest, ValuesOnTwoGpusKeepTheirResidualsWhereTheyAre) {
  if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA GPUs";
  std::mt19937 rng(4);
  auto [gpu, host] = Stores({{"type", "1bit"}}, Random(rng, 1.f), /*optimizer=*/true);
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> a = Random(rng, 0.5f), b = Random(rng, 0.5f);
    const Array out = On(1, std::vector<float>(kSize));
    gpu->PushPull(kKey, {On(0, a), On(1, b)}, {out}).Wait();
    const Array expected = Array::FromFloats(std::vector<float>(kSize));
    host->PushPull(kKey, {Array::FromFloats(a), Array::FromFloats(b)}, {expected}).Wait();
    ASSERT_TRUE(SameBits(Read(out), Read(expected))) << "round " << round;
  }
  // Value 0's residual is on GPU 0: a push with that value on GPU 1 is refused at the call.
  try {
    gpu->Push(kKey, {On(1, Random(rng, 0.5f)), On(0, Random(rng, 0.5f))});
    FAIL() << "a value moved to another GPU was compressed without its residual";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("value 0 is on GPU 1, its compressed pushes so far "
                                               "compressed it on GPU 0"));
  }
}

}  // namespace
}  // namespace dtrain

// A local store's own optimizer on a real GPU (KVStore::Create's "device" and "local" with CUDA
// values), and without one the sum kept there: the pushes that MXNet's local stores update on the
// GPU move the key's weight (or value) there and give, round after round, exactly the weights,
// pulls and saved optimizer state that the same calls on host values give; a push of host values
// moves it back without changing a bit; pulls reach host and device outputs alike, in the order
// of the user's streams. Skipped, with the reason, where no CUDA device is usable (CI has the
// toolkit but no GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda.h"
#include "dtrain/kvstore/kvstore.h"
#include "kvstore/device_staging_kvstore.h"
#include "kvstore/local_kvstore.h"
#include "on_gpu_test.h"

namespace dtrain {
namespace {

constexpr Key kKey = 7;
constexpr int64_t kSize = 3001;  // not a multiple of any kernel's block

std::vector<float> Random(std::mt19937& rng, float scale) {
  return RandomVector(rng, kSize, scale);
}

OptimizerSpec Adam() {
  OptimizerSpec spec;
  spec.name = "adam";
  spec.params = {{"learning_rate", 0.01}, {"wd", 0.001}, {"rescale_grad", 0.5}};
  return spec;
}

class LocalStoreOnDeviceTest : public OnGpuTest {
 protected:
  // `values` in device 0's memory, named as produced on the test's own stream.
  Array OnDevice(const std::vector<float>& values) const {
    const Array a = cuda::NewOnDevice(0, Shape{kSize}, DType::kFloat32, values.data());
    return Array::WrapDevice(a.data(), a.shape(), a.dtype(), 0, stream_, a.owner());
  }

  // Two stores given the same calls, one with the values on the GPU, one with them on the host;
  // both as KVStore::Create makes them where CUDA is built in (the first one's LocalKVStore kept
  // to ask where it holds the key).
  struct Pair {
    LocalKVStore* gpu_local;
    std::unique_ptr<KVStore> gpu, host;
  };
  static Pair Stores(const std::string& type, const std::vector<float>& weight) {
    auto local = std::make_unique<LocalKVStore>(type);
    Pair p{local.get(), std::make_unique<DeviceStagingKVStore>(std::move(local)),
           KVStore::Create(type)};
    for (KVStore* kv : {p.gpu.get(), p.host.get()}) {
      kv->Init(kKey, Array::FromFloats(weight));
      kv->SetOptimizer(Adam());
    }
    return p;
  }

  // Holds the test's stream back for a while, as a long kernel of the user's would.
  void HoldStream() const {
    ASSERT_EQ(
        cudaLaunchHostFunc(
            stream_, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); },
            nullptr),
        cudaSuccess);
  }
};

// Every element of a float32 array whose bytes are all `byte` (what cudaMemsetAsync writes).
float FromBytes(unsigned char byte) {
  const uint32_t bits = 0x01010101u * byte;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

TEST_F(LocalStoreOnDeviceTest, DeviceStoreUpdatesOnTheGpuAsOnTheHost) {
  std::mt19937 rng(5);
  Pair stores = Stores("device", Random(rng, 1.f));
  for (int round = 0; round < 4; ++round) {
    const std::vector<float> a = Random(rng, 0.3f), b = Random(rng, 0.3f);
    const Array out_a = OnDevice(std::vector<float>(kSize)), out_b = OnDevice(a);
    stores.gpu->PushPull(kKey, {OnDevice(a), OnDevice(b)}, {out_a, out_b}).Wait();
    const Array host_out = Array::FromFloats(std::vector<float>(kSize));
    stores.host->PushPull(kKey, {Array::FromFloats(a), Array::FromFloats(b)}, {host_out}).Wait();
    ASSERT_TRUE(SameBits(Read(out_a), Read(host_out))) << "round " << round;
    ASSERT_TRUE(SameBits(Read(out_b), Read(host_out))) << "round " << round;
    ASSERT_TRUE(stores.gpu_local->HoldsOnDevice(kKey)) << "the pushes were staged to the host";
  }
  EXPECT_EQ(stores.gpu->SaveOptimizerState(), stores.host->SaveOptimizerState());
}

TEST_F(LocalStoreOnDeviceTest, WithoutAnOptimizerTheSumStaysOnTheGpu) {
  for (const char* type : {"device", "local"}) {
    SCOPED_TRACE(type);
    std::mt19937 rng(3);
    auto local = std::make_unique<LocalKVStore>(type);
    LocalKVStore* gpu_local = local.get();
    DeviceStagingKVStore gpu(std::move(local));
    std::unique_ptr<KVStore> host = KVStore::Create(type);
    for (KVStore* kv : {static_cast<KVStore*>(&gpu), host.get()}) {
      kv->Init(kKey, Array::FromFloats(Random(rng, 1.f)));
    }
    // "device" sums two replicas on the GPU; "local" takes one as it is (several go to the host).
    const size_t replicas = std::string(type) == "device" ? 2 : 1;
    for (int round = 0; round < 3; ++round) {
      std::vector<Array> on_gpu, on_host;
      for (size_t r = 0; r < replicas; ++r) {
        const std::vector<float> g = Random(rng, 0.3f);
        on_gpu.push_back(OnDevice(g));
        on_host.push_back(Array::FromFloats(g));
      }
      const Array out_a = OnDevice(std::vector<float>(kSize)), out_b = OnDevice(Random(rng, 1.f));
      const Array expected = Array::FromFloats(std::vector<float>(kSize));
      if (round == 1) {
        gpu.Push(kKey, on_gpu);
        const Array host_out = Array::FromFloats(std::vector<float>(kSize));
        gpu.Pull(kKey, {out_a, host_out, out_b}).Wait();  // a host output among them
        host->Push(kKey, on_host);
        host->Pull(kKey, {expected}).Wait();
        ASSERT_TRUE(SameBits(Read(host_out), Read(expected)));
      } else {
        gpu.PushPull(kKey, on_gpu, {out_a, out_b}).Wait();
        host->PushPull(kKey, on_host, {expected}).Wait();
      }
      ASSERT_TRUE(SameBits(Read(out_a), Read(expected))) << "round " << round;
      ASSERT_TRUE(SameBits(Read(out_b), Read(expected))) << "round " << round;
      ASSERT_TRUE(gpu_local->HoldsOnDevice(kKey)) << "the sum was staged to the host";
    }
    // Host values replace it on the host; a pull into host memory reads it from either place.
    const std::vector<float> g = Random(rng, 0.3f);
    gpu.Push(kKey, {Array::FromFloats(g)});
    EXPECT_FALSE(gpu_local->HoldsOnDevice(kKey));
    const Array pulled = Array::FromFloats(std::vector<float>(kSize));
    gpu.Pull(kKey, {pulled}).Wait();
    EXPECT_TRUE(SameBits(Read(pulled), g));
  }
}

TEST_F(LocalStoreOnDeviceTest, PushesAndPullsKeepToTheUsersStreams) {
  std::mt19937 rng(21);
  const std::vector<float> weight = Random(rng, 1.f);
  Pair stores = Stores("device", weight);
  const size_t bytes = kSize * sizeof(float);
  // The gradient is written by work still queued on the user's stream, and overwritten there (with
  // NaNs) right after the push returns: the push must read the value in between.
  const Array grad = OnDevice(std::vector<float>(kSize));
  HoldStream();
  ASSERT_EQ(cudaMemsetAsync(grad.data(), 0x3c, bytes, stream_), cudaSuccess);
  stores.gpu->Push(kKey, {grad});
  ASSERT_EQ(cudaMemsetAsync(grad.data(), 0xff, bytes, stream_), cudaSuccess);
  stores.host->Push(kKey, {Array::FromFloats(std::vector<float>(kSize, FromBytes(0x3c)))});
  ASSERT_TRUE(stores.gpu_local->HoldsOnDevice(kKey));
  // In place, as Python's pushpull is by default, behind the user's queued work again.
  const Array both = OnDevice(std::vector<float>(kSize));
  HoldStream();
  ASSERT_EQ(cudaMemsetAsync(both.data(), 0x3b, bytes, stream_), cudaSuccess);
  stores.gpu->PushPull(kKey, {both}, {both}).Wait();
  const Array expected = Array::FromFloats(std::vector<float>(kSize));
  stores.host
      ->PushPull(kKey, {Array::FromFloats(std::vector<float>(kSize, FromBytes(0x3b)))}, {expected})
      .Wait();
  // Read on the legacy default stream, which does not wait for non-blocking streams: once the
  // operation is done, the weights are in place for any reader.
  std::vector<float> got(kSize);
  ASSERT_EQ(cudaMemcpy(got.data(), both.data(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(SameBits(got, Read(expected)));
}

TEST_F(LocalStoreOnDeviceTest, DeviceStoreSumsValuesOfTwoGpusOnTheFirst) {
  if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA GPUs";
  std::mt19937 rng(17);
  Pair stores = Stores("device", Random(rng, 1.f));
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> a = Random(rng, 0.3f), b = Random(rng, 0.3f);
    const Array on_second = cuda::NewOnDevice(1, Shape{kSize}, DType::kFloat32, b.data());
    const Array out = cuda::NewOnDevice(1, Shape{kSize}, DType::kFloat32, nullptr);
    stores.gpu->PushPull(kKey, {OnDevice(a), on_second}, {out}).Wait();
    const Array expected = Array::FromFloats(std::vector<float>(kSize));
    stores.host->PushPull(kKey, {Array::FromFloats(a), Array::FromFloats(b)}, {expected}).Wait();
    ASSERT_TRUE(SameBits(Read(out), Read(expected))) << "round " << round;
  }
}

TEST_F(LocalStoreOnDeviceTest, TheWeightMovesToTheGpuAndBackWithoutChangingABit) {
  std::mt19937 rng(9);
  const std::vector<float> weight = Random(rng, 1.f);
  LocalKVStore gpu("device"), host("device");
  for (LocalKVStore* kv : {&gpu, &host}) {
    kv->Init(kKey, Array::FromFloats(weight));
    kv->SetOptimizer(Adam());
  }
  const std::vector<Array> two_on_gpu = {OnDevice(weight), OnDevice(weight)};
  EXPECT_TRUE(gpu.UpdatesOnDevice(two_on_gpu));
  EXPECT_FALSE(gpu.UpdatesOnDevice({OnDevice(weight), Array::FromFloats(weight)}));
  EXPECT_FALSE(gpu.HoldsOnDevice(kKey));
  // Device, host, device again: each push updates where its values are.
  for (bool on_gpu : {true, false, true}) {
    const std::vector<float> g = Random(rng, 0.2f);
    gpu.Push(kKey, {on_gpu ? OnDevice(g) : Array::FromFloats(g)});
    host.Push(kKey, {Array::FromFloats(g)});
    EXPECT_EQ(gpu.HoldsOnDevice(kKey), on_gpu);
    const Array pulled = Array::FromFloats(std::vector<float>(kSize));
    const Array expected = Array::FromFloats(std::vector<float>(kSize));
    gpu.Pull(kKey, {pulled});  // into the host, from wherever the weight is
    host.Pull(kKey, {expected});
    ASSERT_TRUE(SameBits(Read(pulled), Read(expected)));
  }
  EXPECT_EQ(gpu.SaveOptimizerState(), host.SaveOptimizerState());
  // A saved state loads back into the store whose state lives on the GPU, and updates go on.
  gpu.LoadOptimizerState(host.SaveOptimizerState());
  const std::vector<float> g = Random(rng, 0.2f);
  gpu.Push(kKey, {OnDevice(g)});
  host.Push(kKey, {Array::FromFloats(g)});
  const Array device_out = OnDevice(std::vector<float>(kSize));
  const Array expected = Array::FromFloats(std::vector<float>(kSize));
  gpu.Pull(kKey, {device_out});
  host.Pull(kKey, {expected});
  EXPECT_TRUE(SameBits(Read(device_out), Read(expected)));
}

TEST_F(LocalStoreOnDeviceTest, LocalStoreUpdatesOneGpuValueThereAndSumsSeveralOnTheHost) {
  std::mt19937 rng(13);
  const std::vector<float> weight = Random(rng, 1.f);
  LocalKVStore local("local");
  local.Init(kKey, Array::FromFloats(weight));
  EXPECT_TRUE(local.UpdatesOnDevice({OnDevice(weight)}))
      << "without an optimizer the value is kept on the GPU";
  local.SetOptimizer(Adam());
  EXPECT_TRUE(local.UpdatesOnDevice({OnDevice(weight)}));
  EXPECT_FALSE(local.UpdatesOnDevice({OnDevice(weight), OnDevice(weight)}))
      << "MXNet's local store merges several values on the CPU";

  Pair stores = Stores("local", weight);
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> g = Random(rng, 0.3f);
    stores.gpu->Push(kKey, {OnDevice(g)});
    stores.host->Push(kKey, {Array::FromFloats(g)});
    const Array out = OnDevice(std::vector<float>(kSize));
    const Array expected = Array::FromFloats(std::vector<float>(kSize));
    stores.gpu->Pull(kKey, {out}).Wait();
    stores.host->Pull(kKey, {expected}).Wait();
    ASSERT_TRUE(SameBits(Read(out), Read(expected))) << "round " << round;
    ASSERT_TRUE(stores.gpu_local->HoldsOnDevice(kKey));
  }
  EXPECT_EQ(stores.gpu->SaveOptimizerState(), stores.host->SaveOptimizerState());
  // Two GPU values to "local", straight to the store: summed on the host, so the weight moves back.
  const std::vector<float> g = Random(rng, 0.3f);
  stores.gpu_local->Push(kKey, {OnDevice(g), OnDevice(g)});
  stores.host->Push(kKey, {Array::FromFloats(g), Array::FromFloats(g)});
  EXPECT_FALSE(stores.gpu_local->HoldsOnDevice(kKey));
  const Array pulled = Array::FromFloats(std::vector<float>(kSize));
  const Array expected = Array::FromFloats(std::vector<float>(kSize));
  stores.gpu->Pull(kKey, {pulled}).Wait();
  stores.host->Pull(kKey, {expected}).Wait();
  EXPECT_TRUE(SameBits(Read(pulled), Read(expected)));
}

}  // namespace
}  // namespace dtrain

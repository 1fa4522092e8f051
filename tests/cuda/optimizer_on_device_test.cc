// Optimizer::UpdateOnDevice on a real GPU: every rule, in every variant, updates weights in device
// memory to exactly the bits the host's Update gives, over several steps, and its state moves
// between host and device without changing a bit. Skipped, with the reason, where no CUDA device
// is usable (CI has the toolkit but no GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda.h"
#include "dtrain/common/error.h"
#include "optim/optimizer.h"
#include "on_gpu_test.h"

namespace dtrain {
namespace {

// Float32 values in device memory, written and read synchronously; the Array names `stream`.
class DeviceFloats {
 public:
  DeviceFloats(const std::vector<float>& values, cudaStream_t stream) : n_(values.size()) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n_ * sizeof(float) + 1), cudaSuccess);
    memory_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    Set(values);
    array_ =
        Array::WrapDevice(p, Shape{static_cast<int64_t>(n_)}, DType::kFloat32, 0, stream, memory_);
  }
  void Set(const std::vector<float>& values) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(memory_.get(), values.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    // From pageable memory the copy may return before it has landed, and the updates run on a
    // non-blocking stream that does not wait for it.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<float> Get() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), memory_.get(), n_ * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return v;
  }
  const Array& array() const { return array_; }

 private:
  size_t n_;
  std::shared_ptr<void> memory_;
  Array array_;
};

struct Case {
  const char* label;
  OptimizerSpec spec;
};

// Every rule and variant the kernels distinguish: clipping, weight clipping, momentum kinds,
// centering, weight decay, a schedule.
std::vector<Case> Cases() {
  return {
      {"sgd", {"sgd", {{"learning_rate", 0.1}}}},
      {"sgd_wd_clip", {"sgd", {{"learning_rate", 0.1}, {"wd", 0.01}, {"clip_gradient", 0.5}}}},
      {"sgd_momentum", {"sgd", {{"learning_rate", 0.05}, {"momentum", 0.9}, {"wd", 1e-4}}}},
      {"sgd_momentum_clip",
       {"sgd", {{"learning_rate", 0.05}, {"momentum", 0.9}, {"clip_gradient", 0.3}}}},
      {"nag", {"nag", {{"learning_rate", 0.05}, {"momentum", 0.9}, {"wd", 1e-3}}}},
      {"nag_clip", {"nag", {{"learning_rate", 0.05}, {"momentum", 0.8}, {"clip_gradient", 0.2}}}},
      {"adam", {"adam", {{"learning_rate", 0.01}, {"wd", 1e-3}, {"rescale_grad", 0.5}}}},
      {"adam_clip", {"adam", {{"learning_rate", 0.01}, {"clip_gradient", 0.4}}}},
      {"adagrad", {"adagrad", {{"learning_rate", 0.1}, {"wd", 1e-3}}}},
      {"adagrad_clip", {"adagrad", {{"learning_rate", 0.1}, {"clip_gradient", 0.3}}}},
      {"rmsprop", {"rmsprop", {{"learning_rate", 0.01}, {"wd", 1e-3}}}},
      {"rmsprop_clips",
       {"rmsprop", {{"learning_rate", 0.01}, {"clip_gradient", 0.5}, {"clip_weights", 0.8}}}},
      {"rmsprop_centered",
       {"rmsprop", {{"learning_rate", 0.01}, {"centered", 1}, {"gamma2", 0.7}}}},
      {"rmsprop_centered_clips",
       {"rmsprop",
        {{"learning_rate", 0.01}, {"centered", 1}, {"clip_gradient", 0.5}, {"clip_weights", 1}}}},
      {"sgd_step_schedule",
       {"sgd",
        {{"learning_rate", 0.1}, {"momentum", 0.9}, {"lr_step", 2}, {"lr_factor", 0.5}},
        "step"}},
  };
}

class OptimizerOnDeviceTest : public OnGpuTest {};

// 4099 elements: whole blocks of the kernel and a ragged tail.
constexpr size_t kElements = 4099;
constexpr int kSteps = 6;

TEST_F(OptimizerOnDeviceTest, EveryRuleMatchesTheHostBitForBit) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.label);
    std::mt19937 rng(7);
    std::vector<float> host_weight = RandomVector(rng, kElements, 1.f);
    DeviceFloats weight(host_weight, stream_);
    DeviceFloats grad(std::vector<float>(kElements), stream_);
    auto on_host = CreateOptimizer(c.spec);
    auto on_device = CreateOptimizer(c.spec);
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float> g = RandomVector(rng, kElements, 2.f);
      grad.Set(g);
      on_host->Update(3, host_weight, g);
      on_device->UpdateOnDevice(3, weight.array(), grad.array());
      ASSERT_TRUE(SameBits(weight.Get(), host_weight)) << "after update " << step + 1;
    }
    EXPECT_EQ(on_device->UpdateCount(3), static_cast<uint64_t>(kSteps));
    // The state is saved from the device as the host's is saved from its buffers.
    EXPECT_EQ(on_device->SaveState(), on_host->SaveState());
  }
}

TEST_F(OptimizerOnDeviceTest, BigIndexesTakeSeveralRoundsOfTheGridAndAnotherStream) {
  // More elements than the kernel's 4096 blocks of 256 threads cover at once; every other update
  // on a second stream, so that the state's buffers change streams (ordered by an event).
  constexpr size_t kBig = (size_t{1} << 20) * 2 + 4099;
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  const OptimizerSpec spec{"adam", {{"learning_rate", 0.01}, {"wd", 1e-3}}};
  std::mt19937 rng(5);
  std::vector<float> host_weight = RandomVector(rng, kBig, 1.f);
  DeviceFloats weight(host_weight, stream_);
  DeviceFloats grad(std::vector<float>(kBig), stream_);
  DeviceFloats weight_other(host_weight, other);
  auto on_host = CreateOptimizer(spec);
  auto on_device = CreateOptimizer(spec);
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> g = RandomVector(rng, kBig, 2.f);
    grad.Set(g);
    on_host->Update(0, host_weight, g);
    const bool on_other = step % 2 == 1;
    if (on_other) weight_other.Set(weight.Get());
    on_device->UpdateOnDevice(0, on_other ? weight_other.array() : weight.array(), grad.array());
    if (on_other) weight.Set(weight_other.Get());
    ASSERT_TRUE(SameBits(weight.Get(), host_weight)) << "after update " << step + 1;
  }
  EXPECT_EQ(on_device->SaveState(), on_host->SaveState());
  cudaStreamDestroy(other);
}

TEST_F(OptimizerOnDeviceTest, StateMovesBetweenHostAndDeviceUnchanged) {
  const OptimizerSpec spec{"adam", {{"learning_rate", 0.01}, {"wd", 1e-3}}};
  std::mt19937 rng(11);
  std::vector<float> reference_weight = RandomVector(rng, kElements, 1.f);
  std::vector<float> moving_weight = reference_weight;
  DeviceFloats weight(moving_weight, stream_);
  DeviceFloats grad(std::vector<float>(kElements), stream_);
  auto reference = CreateOptimizer(spec);
  auto moving = CreateOptimizer(spec);
  // Host, host, device, device, host, device: the weights follow the state where it goes.
  const bool on_device[] = {false, false, true, true, false, true};
  for (bool device : on_device) {
    const std::vector<float> g = RandomVector(rng, kElements, 2.f);
    reference->Update(0, reference_weight, g);
    if (device) {
      weight.Set(moving_weight);
      grad.Set(g);
      moving->UpdateOnDevice(0, weight.array(), grad.array());
      moving_weight = weight.Get();
    } else {
      moving->Update(0, moving_weight, g);
    }
    ASSERT_TRUE(SameBits(moving_weight, reference_weight));
  }
  EXPECT_EQ(moving->SaveState(), reference->SaveState());

  // A state loaded from bytes goes to the device with the next device update.
  auto restored = CreateOptimizer(spec);
  restored->LoadState(reference->SaveState());
  const std::vector<float> g = RandomVector(rng, kElements, 2.f);
  reference->Update(0, reference_weight, g);
  weight.Set(moving_weight);
  grad.Set(g);
  restored->UpdateOnDevice(0, weight.array(), grad.array());
  EXPECT_TRUE(SameBits(weight.Get(), reference_weight));
}

TEST_F(OptimizerOnDeviceTest, RefusesWhatItCannotUpdate) {
  auto optimizer = CreateOptimizer({"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}});
  DeviceFloats weight(std::vector<float>(8, 1.f), stream_);
  DeviceFloats shorter(std::vector<float>(7, 1.f), stream_);
  std::vector<float> host(8, 1.f);
  const Array host_grad = Array::FromFloats(host);
  EXPECT_THROW(optimizer->UpdateOnDevice(0, weight.array(), host_grad), InvalidArgument);
  EXPECT_THROW(optimizer->UpdateOnDevice(0, weight.array(), shorter.array()), InvalidArgument);
  // Refused calls changed nothing: a first good update still counts as the first.
  EXPECT_EQ(optimizer->UpdateCount(0), 0u);
  optimizer->UpdateOnDevice(0, weight.array(), weight.array());
  EXPECT_EQ(optimizer->UpdateCount(0), 1u);
  // An index keeps its length, on the device as on the host.
  EXPECT_THROW(optimizer->UpdateOnDevice(0, shorter.array(), shorter.array()), InvalidArgument);
}

}  // namespace
}  // namespace dtrain

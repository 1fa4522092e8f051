// The fixture of the tests that need a GPU: skipped, with the reason, where no CUDA device is
// usable; device 0 current and a non-blocking stream of its own (as torch's side streams are).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/cuda.h"

namespace dtrain {

// `n` normally distributed values of standard deviation `scale`: gradients and weights.
inline std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

class OnGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "needs a CUDA GPU: " << cuda::Unavailable();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
};

}  // namespace dtrain

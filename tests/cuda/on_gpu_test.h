// The fixture of the tests that need a GPU: skipped, with the reason, where no CUDA device is
// usable; device 0 current and a non-blocking stream of its own (as torch's side streams are).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda/cuda.h"
#include "optim/optim_test_util.h"

namespace dtrain {

// A float32 array's values, wherever it is (a device array is copied to the host first).
inline std::vector<float> Read(const Array& a) {
  const Array host = a.on_device() ? cuda::ToHost(a) : a;
  const float* p = static_cast<const float*>(host.data());
  return std::vector<float>(p, p + host.size());
}

// Bit-for-bit comparison and random values, as the optimizer tests have them.
using optim_test::RandomVector;
using optim_test::SameBits;

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

// device_codec.h with the CUDA runtime: one thread per element, running formulas.h, and the
// codes of a word gathered from the threads that made them (a warp's ballot for 1-bit, whose 32
// values fill one word; shuffles within each half warp for 2-bit, whose 16 values do). Whole warps
// run every round (the loop's bound is rounded up to words), so the gathers never miss a lane.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "compression/kernels/device_codec.h"
#include "compression/kernels/formulas.h"
#include "cuda/cuda_check.h"
#include "cuda/launch_grid.h"

namespace dtrain {
namespace {

constexpr unsigned kAllLanes = 0xffffffffu;

__global__ void TwoBitKernel(const float* g, float* r, int64_t n, float t, uint32_t* out) {
  const int64_t rounded =
      (n + codec::kTwoBitPerWord - 1) / codec::kTwoBitPerWord * codec::kTwoBitPerWord;
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i - threadIdx.x % 32 < rounded;
       i += stride) {
    const int slot = static_cast<int>(i % codec::kTwoBitPerWord);
    uint32_t word = 0;
    if (i < n) {
      float residual = r[i];
      word = codec::TwoBitCode(g[i], residual, t) << (2 * slot);
      r[i] = residual;
    }
    // OR across the 16 lanes of this half warp (xor offsets below 16 stay inside it).
    for (int offset = 8; offset > 0; offset /= 2) word |= __shfl_xor_sync(kAllLanes, word, offset);
    if (slot == 0 && i < rounded) out[i / codec::kTwoBitPerWord] = word;
  }
}

__global__ void OneBitKernel(const float* g, float* r, int64_t n, float t, uint32_t* out) {
  const int64_t rounded =
      (n + codec::kOneBitPerWord - 1) / codec::kOneBitPerWord * codec::kOneBitPerWord;
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i - threadIdx.x % 32 < rounded;
       i += stride) {
    uint32_t bit = 0;
    if (i < n) {
      float residual = r[i];
      bit = codec::OneBitCode(g[i], residual, t);
      r[i] = residual;
    }
    // Lane j's bit lands in bit j: value i of a word in bit i, the format's order.
    const uint32_t word = __ballot_sync(kAllLanes, bit != 0);
    if (threadIdx.x % 32 == 0) out[i / codec::kOneBitPerWord] = word;
  }
}

__global__ void Fp16Kernel(const float* g, int64_t n, __half* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = __float2half_rn(g[i]);
  }
}

}  // namespace

void CompressOnDevice(const CompressionSpec& spec, const float* grad, float* residual, int64_t n,
                      void* out, int device, void* stream) {
  if (n <= 0) return;
  cuda::DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  switch (spec.type) {
    case Compression::kNone:
      cuda::Check(
          cudaMemcpyAsync(out, grad, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, s),
          "copy on the device");
      return;
    case Compression::kTwoBit:
      TwoBitKernel<<<cuda::GridBlocks(n), cuda::kBlockThreads, 0, s>>>(
          grad, residual, n, spec.threshold, static_cast<uint32_t*>(out));
      break;
    case Compression::kOneBit:
      OneBitKernel<<<cuda::GridBlocks(n), cuda::kBlockThreads, 0, s>>>(
          grad, residual, n, spec.threshold, static_cast<uint32_t*>(out));
      break;
    case Compression::kFp16:
      Fp16Kernel<<<cuda::GridBlocks(n), cuda::kBlockThreads, 0, s>>>(grad, n,
                                                                     static_cast<__half*>(out));
      break;
  }
  cuda::Check(cudaGetLastError(), "gradient compression on the device");
}

}  // namespace dtrain

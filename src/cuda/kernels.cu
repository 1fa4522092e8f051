#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels.h"
#include "cuda/launch_grid.h"

namespace dtrain::cuda {
namespace {

// Element types in float32 arithmetic, as the host path computes (elementwise.h).
__device__ float ToFloat(__half x) { return __half2float(x); }
__device__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ T FromFloat(float x);
template <>
__device__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Plain separate adds (no fused multiply-add can change them): the results equal the host's.
template <typename T>
__global__ void AddIntoKernel(T* dst, const T* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    dst[i] = __fadd_rn(dst[i], src[i]);
  }
}
template <>
__global__ void AddIntoKernel<double>(double* dst, const double* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    dst[i] = __dadd_rn(dst[i], src[i]);
  }
}
template <typename T>
__global__ void AddIntoHalfKernel(T* dst, const T* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    dst[i] = FromFloat<T>(__fadd_rn(ToFloat(dst[i]), ToFloat(src[i])));
  }
}

}  // namespace

cudaError_t LaunchAddInto(void* dst, const void* src, int64_t n, DType dtype, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32:
      AddIntoKernel<<<GridBlocks(n), kBlockThreads, 0, stream>>>(static_cast<float*>(dst),
                                                                 static_cast<const float*>(src), n);
      break;
    case DType::kFloat64:
      AddIntoKernel<<<GridBlocks(n), kBlockThreads, 0, stream>>>(
          static_cast<double*>(dst), static_cast<const double*>(src), n);
      break;
    case DType::kFloat16:
      AddIntoHalfKernel<<<GridBlocks(n), kBlockThreads, 0, stream>>>(
          static_cast<__half*>(dst), static_cast<const __half*>(src), n);
      break;
    case DType::kBFloat16:
      AddIntoHalfKernel<<<GridBlocks(n), kBlockThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(dst), static_cast<const __nv_bfloat16*>(src), n);
      break;
  }
  return cudaGetLastError();
}

}  // namespace dtrain::cuda

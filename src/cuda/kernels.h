// The CUDA kernels behind cuda.h's arithmetic, launched on a given stream (no synchronisation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dtrain/common/dtype.h"

namespace dtrain::cuda {

// dst[i] += src[i] for i < n.
cudaError_t LaunchAddInto(void* dst, const void* src, int64_t n, DType dtype, cudaStream_t stream);

}  // namespace dtrain::cuda

// What the front end needs of torch's CUDA side, in one place: the stream torch queues a device's
// work on now, which the core's device Arrays record so that dtrain's copies wait for that work
// (src/cuda/cuda.h).
//
// Only where both torch and dtrain were built with CUDA (a PyPI torch 2 and the toolkit: the build
// defines DTRAIN_TORCH_CUDA and links c10_cuda). Elsewhere CUDA tensors cannot exist in the
// process, and asking is a logic error reported as InvalidArgument.
#pragma once

#include <torch/torch.h>

#include "dtrain/common/error.h"

#if DTRAIN_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace dtrain::train {

// The cudaStream_t of torch's current stream on `device` (a CUDA device).
inline void* CurrentCudaStream(const torch::Device& device) {
#if DTRAIN_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  throw InvalidArgument(
      "a CUDA tensor, but dtrain's front end was built without torch's CUDA "
      "headers (a CUDA build of torch and the CUDA toolkit are both needed)");
#endif
}

}  // namespace dtrain::train

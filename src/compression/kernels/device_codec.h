// Gradient compression (codec.h's Compress) on values in a CUDA device's memory, so that only the
// compressed bytes cross to the host: 16 times fewer for 2-bit, 32 for 1-bit, 2 for fp16. The
// kernels are queued on the given stream and never waited for. Built from device_codec.cu with
// the CUDA toolkit; without it the call throws InvalidArgument.
//
// Free of CUDA's headers: host-only code (the kvstore's staging) calls it.
#pragma once

#include <cstdint>

#include "dtrain/compression/compression_spec.h"

namespace dtrain {

// Compress(spec, grad, residual, n, out) with every pointer in the memory of `device`, queued on
// `stream` (a cudaStream_t of that device). The words equal the host's bit for bit, and so does
// the residual; fp16 rounds to nearest even as the host does (a NaN stays a NaN, its payload may
// differ) and ignores `residual`. Throws dtrain::Error if CUDA refuses the launch.
void CompressOnDevice(const CompressionSpec& spec, const float* grad, float* residual, int64_t n,
                      void* out, int device, void* stream);

}  // namespace dtrain

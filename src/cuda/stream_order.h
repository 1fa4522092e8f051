// How dtrain's own streams (its copies in src/cuda, NCCL's in src/collectives/nccl) wait for the
// producer of a device Array without a host synchronisation. CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include "dtrain/common/array.h"

namespace dtrain::cuda {

// Queues on `stream` a wait for the work already queued on `array`'s producer stream. The event
// belongs to the array's device (as its stream does); `stream` may be another device's.
void OrderAfterProducer(const Array& array, cudaStream_t stream);

}  // namespace dtrain::cuda

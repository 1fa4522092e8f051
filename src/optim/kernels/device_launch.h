// The optimizers' element formulas (formulas.h) run over values in a CUDA device's memory: one
// grid-stride kernel per call, queued on the given stream, never waited for. Built from
// device_launch.cu with the CUDA toolkit; without it every launch throws InvalidArgument.
//
// Kept to C++17 and free of CUDA's headers: the host-only rules call it.
#pragma once

#include <cstddef>

#include "optim/kernels/formulas.h"

namespace dtrain::kernels {

// One update's values, all in the memory of `device`; the kernel is queued on `stream` (a
// cudaStream_t of that device; null is its default stream).
struct DeviceTarget {
  int device = 0;
  void* stream = nullptr;
  float* weight = nullptr;
  const float* grad = nullptr;
  float* state[3] = {nullptr, nullptr, nullptr};  // the rule's buffers, in its formula's order
  size_t n = 0;
};

enum class SgdKind { kPlain, kMomentum, kNesterov };

// Each throws dtrain::Error if CUDA refuses the launch (its error named).
void LaunchSgd(const SgdRates& rates, SgdKind kind, bool clip, const DeviceTarget& target);
void LaunchAdam(const AdamRates& rates, bool clip, const DeviceTarget& target);
void LaunchAdaGrad(const AdaGradRates& rates, bool clip, const DeviceTarget& target);
void LaunchRMSProp(const RMSPropRates& rates, bool centered, bool clip, bool clip_weights,
                   const DeviceTarget& target);

}  // namespace dtrain::kernels

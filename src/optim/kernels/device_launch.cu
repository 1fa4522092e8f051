// device_launch.h with the CUDA runtime: one grid-stride kernel per update, each thread running
// formulas.h on its elements. Compiled with -fmad=false (CMakeLists.txt), so that no multiply-add
// is fused and every element equals the host's.
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "cuda/launch_grid.h"
#include "optim/kernels/device_launch.h"

namespace dtrain::kernels {
namespace {

// What a kernel's threads share: the values' pointers. `F` updates element i through them.
template <typename F>
__global__ void EachElement(F update, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{blockDim.x} * gridDim.x) {
    update(i);
  }
}

template <typename F>
void Launch(const DeviceTarget& t, F update, const char* what) {
  if (t.n == 0) return;
  cuda::DeviceGuard guard(t.device);
  EachElement<<<cuda::GridBlocks(static_cast<int64_t>(t.n)), cuda::kBlockThreads, 0,
                static_cast<cudaStream_t>(t.stream)>>>(update, t.n);
  cuda::Check(cudaGetLastError(), what);
}

// One functor per formula: nvcc needs named types for kernels' arguments (no extended lambdas).
template <bool kClip>
struct SgdPlainOp {
  SgdRates r;
  float* w;
  const float* g;
  __device__ void operator()(size_t i) const { SgdPlain<kClip>(r, w[i], g[i]); }
};
template <bool kClip, bool kNesterov>
struct SgdMomentumOp {
  SgdRates r;
  float* w;
  float* mom;
  const float* g;
  __device__ void operator()(size_t i) const {
    if constexpr (kNesterov) {
      SgdNesterov<kClip>(r, w[i], mom[i], g[i]);
    } else {
      SgdMomentum<kClip>(r, w[i], mom[i], g[i]);
    }
  }
};
template <bool kClip>
struct AdamOp {
  AdamRates r;
  float* w;
  float* m;
  float* v;
  const float* g;
  __device__ void operator()(size_t i) const { AdamElement<kClip>(r, w[i], m[i], v[i], g[i]); }
};
template <bool kClip>
struct AdaGradOp {
  AdaGradRates r;
  float* w;
  float* history;
  const float* g;
  __device__ void operator()(size_t i) const { AdaGradElement<kClip>(r, w[i], history[i], g[i]); }
};
template <bool kClip, bool kClipWeights>
struct RMSPropOp {
  RMSPropRates r;
  float* w;
  float* n_avg;
  const float* g;
  __device__ void operator()(size_t i) const {
    RMSPropPlain<kClip, kClipWeights>(r, w[i], n_avg[i], g[i]);
  }
};
template <bool kClip, bool kClipWeights>
struct RMSPropCenteredOp {
  RMSPropRates r;
  float* w;
  float* n_avg;
  float* g_avg;
  float* delta;
  const float* g;
  __device__ void operator()(size_t i) const {
    RMSPropCentered<kClip, kClipWeights>(r, w[i], n_avg[i], g_avg[i], delta[i], g[i]);
  }
};

template <bool kClip>
void Sgd(const SgdRates& r, SgdKind kind, const DeviceTarget& t) {
  const char* what = "the SGD update on the device";
  switch (kind) {
    case SgdKind::kPlain:
      return Launch(t, SgdPlainOp<kClip>{r, t.weight, t.grad}, what);
    case SgdKind::kMomentum:
      return Launch(t, SgdMomentumOp<kClip, false>{r, t.weight, t.state[0], t.grad}, what);
    case SgdKind::kNesterov:
      return Launch(t, SgdMomentumOp<kClip, true>{r, t.weight, t.state[0], t.grad}, what);
  }
}

template <bool kClip, bool kClipWeights>
void RMSProp(const RMSPropRates& r, bool centered, const DeviceTarget& t) {
  const char* what = "the RMSProp update on the device";
  if (centered) {
    Launch(t,
           RMSPropCenteredOp<kClip, kClipWeights>{r, t.weight, t.state[0], t.state[1], t.state[2],
                                                  t.grad},
           what);
  } else {
    Launch(t, RMSPropOp<kClip, kClipWeights>{r, t.weight, t.state[0], t.grad}, what);
  }
}

}  // namespace

void LaunchSgd(const SgdRates& rates, SgdKind kind, bool clip, const DeviceTarget& target) {
  clip ? Sgd<true>(rates, kind, target) : Sgd<false>(rates, kind, target);
}

void LaunchAdam(const AdamRates& rates, bool clip, const DeviceTarget& t) {
  const char* what = "the Adam update on the device";
  if (clip) {
    Launch(t, AdamOp<true>{rates, t.weight, t.state[0], t.state[1], t.grad}, what);
  } else {
    Launch(t, AdamOp<false>{rates, t.weight, t.state[0], t.state[1], t.grad}, what);
  }
}

void LaunchAdaGrad(const AdaGradRates& rates, bool clip, const DeviceTarget& t) {
  const char* what = "the AdaGrad update on the device";
  if (clip) {
    Launch(t, AdaGradOp<true>{rates, t.weight, t.state[0], t.grad}, what);
  } else {
    Launch(t, AdaGradOp<false>{rates, t.weight, t.state[0], t.grad}, what);
  }
}

void LaunchRMSProp(const RMSPropRates& rates, bool centered, bool clip, bool clip_weights,
                   const DeviceTarget& target) {
  if (clip) {
    clip_weights ? RMSProp<true, true>(rates, centered, target)
                 : RMSProp<true, false>(rates, centered, target);
  } else {
    clip_weights ? RMSProp<false, true>(rates, centered, target)
                 : RMSProp<false, false>(rates, centered, target);
  }
}

}  // namespace dtrain::kernels

#include "optim/rules/rmsprop.h"

#include <cmath>
#include <utility>

#include "optim/kernels/device_launch.h"

namespace dtrain {
namespace {

using kernels::RMSPropRates;

template <bool kClip, bool kClipWeights>
void PlainUpdate(const RMSPropRates& r, float* __restrict w, float* __restrict n_avg,
                 const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i)
    kernels::RMSPropPlain<kClip, kClipWeights>(r, w[i], n_avg[i], g[i]);
}

template <bool kClip, bool kClipWeights>
void CenteredUpdate(const RMSPropRates& r, float* __restrict w, float* __restrict n_avg,
                    float* __restrict g_avg, float* __restrict delta, const float* __restrict g,
                    size_t n) {
  for (size_t i = 0; i < n; ++i) {
    // Through locals rather than references into the arrays: with references GCC 12 moves more
    // values between registers in this vectorised loop, 9-15% slower (docs/performance.md).
    float wi = w[i], ni = n_avg[i], gi = g_avg[i], di = delta[i];
    kernels::RMSPropCentered<kClip, kClipWeights>(r, wi, ni, gi, di, g[i]);
    w[i] = wi;
    n_avg[i] = ni;
    g_avg[i] = gi;
    delta[i] = di;
  }
}

template <bool kClip, bool kClipWeights>
void Run(bool centered, const RMSPropRates& r, std::span<float> weight, std::span<const float> grad,
         ElementwiseOptimizer::StateBuffers state) {
  const size_t n = weight.size();
  if (centered) {
    CenteredUpdate<kClip, kClipWeights>(r, weight.data(), state[0], state[1], state[2], grad.data(),
                                        n);
  } else {
    PlainUpdate<kClip, kClipWeights>(r, weight.data(), state[0], grad.data(), n);
  }
}

}  // namespace

RMSProp::RMSProp(OptimizerSpec spec)
    : ElementwiseOptimizer(std::move(spec), "rmsprop",
                           {"gamma1", "gamma2", "epsilon", "centered", "clip_weights", "wd",
                            "rescale_grad", "clip_gradient"},
                           0.001) {
  gamma1_ = params().InRange("gamma1", 0.9f, 0.f, 1.f);
  gamma2_ = params().InRange("gamma2", 0.9f, 0.f, 1.f);
  epsilon_ = params().NonNegative("epsilon", 1e-8f);
  centered_ = params().Flag("centered", false);
  clip_weights_ = params().Any("clip_weights", -1.f);
  wd_ = params().NonNegative("wd", 0.f);
  rescale_grad_ = params().Positive("rescale_grad", 1.f);
  clip_gradient_ = params().Any("clip_gradient", -1.f);
  set_state_buffers(centered_ ? 3 : 1);
}

kernels::RMSPropRates RMSProp::RatesFor(const Step& step) const {
  return {static_cast<float>(step.learning_rate),
          gamma1_,
          gamma2_,
          1.f - gamma1_,
          epsilon_,
          wd_,
          rescale_grad_,
          clip_gradient_,
          clip_weights_};
}

void RMSProp::Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
                    StateBuffers state) {
  const RMSPropRates r = RatesFor(step);
  const bool clip = clip_gradient_ > 0;
  const bool clip_weights = clip_weights_ > 0;
  if (clip) {
    clip_weights ? Run<true, true>(centered_, r, weight, grad, state)
                 : Run<true, false>(centered_, r, weight, grad, state);
  } else {
    clip_weights ? Run<false, true>(centered_, r, weight, grad, state)
                 : Run<false, false>(centered_, r, weight, grad, state);
  }
}

void RMSProp::ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) {
  kernels::LaunchRMSProp(RatesFor(step), centered_, clip_gradient_ > 0, clip_weights_ > 0, target);
}

}  // namespace dtrain

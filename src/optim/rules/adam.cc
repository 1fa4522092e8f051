#include "optim/rules/adam.h"

#include <cmath>
#include <utility>

#include "optim/kernels/device_launch.h"

namespace dtrain {
namespace {

using kernels::AdamRates;

template <bool kClip>
void AdamUpdate(const AdamRates& r, float* __restrict w, float* __restrict m, float* __restrict v,
                const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    // Through locals rather than references into the arrays: with references GCC 12 moves more
    // values between registers in this vectorised loop, 9-15% slower (docs/performance.md).
    float wi = w[i], mi = m[i], vi = v[i];
    kernels::AdamElement<kClip>(r, wi, mi, vi, g[i]);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

Adam::Adam(OptimizerSpec spec)
    : ElementwiseOptimizer(std::move(spec), "adam",
                           {"beta1", "beta2", "epsilon", "wd", "rescale_grad", "clip_gradient"},
                           0.001) {
  beta1_ = params().InRange("beta1", 0.9f, 0.f, 1.f);
  beta2_ = params().InRange("beta2", 0.999f, 0.f, 1.f);
  beta1_exact_ = params().Exact("beta1", 0.9);
  beta2_exact_ = params().Exact("beta2", 0.999);
  epsilon_ = params().NonNegative("epsilon", 1e-8f);
  wd_ = params().NonNegative("wd", 0.f);
  rescale_grad_ = params().Positive("rescale_grad", 1.f);
  clip_gradient_ = params().Any("clip_gradient", -1.f);
  set_state_buffers(2);
}

kernels::AdamRates Adam::RatesFor(const Step& step) const {
  // MXNet's Adam.update, in Python floats (double).
  const double t = static_cast<double>(step.t);
  const double coef1 = 1. - std::pow(beta1_exact_, t);
  const double coef2 = 1. - std::pow(beta2_exact_, t);
  const double lr = step.learning_rate * (std::sqrt(coef2) / coef1);
  return {static_cast<float>(lr), beta1_,        beta2_, 1.f - beta1_, 1.f - beta2_, epsilon_, wd_,
          rescale_grad_,          clip_gradient_};
}

void Adam::Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
                 StateBuffers state) {
  const AdamRates r = RatesFor(step);
  const size_t n = weight.size();
  float* m = state[0];
  float* v = state[1];
  clip_gradient_ > 0 ? AdamUpdate<true>(r, weight.data(), m, v, grad.data(), n)
                     : AdamUpdate<false>(r, weight.data(), m, v, grad.data(), n);
}

void Adam::ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) {
  kernels::LaunchAdam(RatesFor(step), clip_gradient_ > 0, target);
}

}  // namespace dtrain

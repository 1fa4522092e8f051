#include "optim/rules/adagrad.h"

#include <cmath>
#include <utility>

#include "optim/kernels/device_launch.h"

namespace dtrain {
namespace {

using kernels::AdaGradRates;

template <bool kClip>
void AdaGradUpdate(const AdaGradRates& r, float* __restrict w, float* __restrict history,
                   const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) kernels::AdaGradElement<kClip>(r, w[i], history[i], g[i]);
}

}  // namespace

AdaGrad::AdaGrad(OptimizerSpec spec)
    : ElementwiseOptimizer(std::move(spec), "adagrad",
                           {"eps", "epsilon", "wd", "rescale_grad", "clip_gradient"}, 0.01) {
  eps_ = params().NonNegative(params().OneOf("eps", "epsilon"), 1e-7f);
  wd_ = params().NonNegative("wd", 0.f);
  rescale_grad_ = params().Positive("rescale_grad", 1.f);
  clip_gradient_ = params().Any("clip_gradient", -1.f);
  set_state_buffers(1);
}

kernels::AdaGradRates AdaGrad::RatesFor(const Step& step) const {
  return {static_cast<float>(step.learning_rate), eps_, wd_, rescale_grad_, clip_gradient_};
}

void AdaGrad::Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
                    StateBuffers state) {
  const AdaGradRates r = RatesFor(step);
  clip_gradient_ > 0 ? AdaGradUpdate<true>(r, weight.data(), state[0], grad.data(), weight.size())
                     : AdaGradUpdate<false>(r, weight.data(), state[0], grad.data(), weight.size());
}

void AdaGrad::ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) {
  kernels::LaunchAdaGrad(RatesFor(step), clip_gradient_ > 0, target);
}

}  // namespace dtrain

#include "optim/rules/adagrad.h"

#include <cmath>
#include <utility>

namespace dtrain {
namespace {

struct AdaGradRates {
  float lr, eps, wd, rescale, clip;
};

// MXNet's AdaGrad.update for dense arrays: grad * rescale_grad; clip; history += square(grad);
// div = grad / sqrt(history + eps); weight += (div + weight * wd) * -lr. Here the last step is
// weight - (...) * lr, the same float32 result.
template <bool kClip>
void AdaGradUpdate(const AdaGradRates& r, float* __restrict w, float* __restrict history,
                   const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float gr = g[i] * r.rescale;
    if constexpr (kClip) gr = ClipTo(gr, r.clip);
    history[i] = history[i] + gr * gr;
    const float div = gr / std::sqrt(history[i] + r.eps);
    w[i] = w[i] - (div + w[i] * r.wd) * r.lr;
  }
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

void AdaGrad::Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
                    StateBuffers state) {
  const AdaGradRates r{static_cast<float>(step.learning_rate), eps_, wd_, rescale_grad_,
                       clip_gradient_};
  clip_gradient_ > 0 ? AdaGradUpdate<true>(r, weight.data(), state[0], grad.data(), weight.size())
                     : AdaGradUpdate<false>(r, weight.data(), state[0], grad.data(), weight.size());
}

}  // namespace dtrain

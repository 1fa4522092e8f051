#include "optim/rules/sgd.h"

#include <string_view>
#include <utility>
#include <vector>

#include "optim/kernels/device_launch.h"

namespace dtrain {
namespace {

using kernels::SgdRates;

// Options that change the formula are template parameters rather than tests inside the loops:
// the loops then have no branches and the compiler vectorises them.

template <bool kClip>
void PlainUpdate(const SgdRates& r, float* __restrict w, const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) kernels::SgdPlain<kClip>(r, w[i], g[i]);
}

template <bool kClip>
void MomentumUpdate(const SgdRates& r, float* __restrict w, float* __restrict mom,
                    const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) kernels::SgdMomentum<kClip>(r, w[i], mom[i], g[i]);
}

template <bool kClip>
void NesterovUpdate(const SgdRates& r, float* __restrict w, float* __restrict mom,
                    const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) kernels::SgdNesterov<kClip>(r, w[i], mom[i], g[i]);
}

}  // namespace

SGD::SGD(OptimizerSpec spec, bool nag)
    : ElementwiseOptimizer(
          std::move(spec), "sgd",
          nag ? std::vector<std::string_view>{"momentum", "wd", "rescale_grad", "clip_gradient"}
              : std::vector<std::string_view>{"momentum", "wd", "rescale_grad", "clip_gradient",
                                              "nesterov"},
          0.01) {
  momentum_ = params().InRange("momentum", 0.f, 0.f, 1.f);
  wd_ = params().NonNegative("wd", 0.f);
  rescale_grad_ = params().Positive("rescale_grad", 1.f);
  clip_gradient_ = params().Any("clip_gradient", -1.f);
  nesterov_ = nag || params().Flag("nesterov", false);
  // As MXNet's SGD and NAG do, momentum 0 keeps no state and takes the plain formula.
  set_state_buffers(momentum_ == 0 ? 0 : 1);
}

kernels::SgdRates SGD::RatesFor(const Step& step) const {
  return {static_cast<float>(step.learning_rate), momentum_, wd_, rescale_grad_, clip_gradient_};
}

void SGD::Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
                StateBuffers state) {
  const SgdRates r = RatesFor(step);
  const bool clip = clip_gradient_ > 0;
  const size_t n = weight.size();
  if (momentum_ == 0) {
    clip ? PlainUpdate<true>(r, weight.data(), grad.data(), n)
         : PlainUpdate<false>(r, weight.data(), grad.data(), n);
    return;
  }
  float* mom = state[0];
  if (nesterov_) {
    clip ? NesterovUpdate<true>(r, weight.data(), mom, grad.data(), n)
         : NesterovUpdate<false>(r, weight.data(), mom, grad.data(), n);
  } else {
    clip ? MomentumUpdate<true>(r, weight.data(), mom, grad.data(), n)
         : MomentumUpdate<false>(r, weight.data(), mom, grad.data(), n);
  }
}

void SGD::ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) {
  const kernels::SgdKind kind = momentum_ == 0 ? kernels::SgdKind::kPlain
                                : nesterov_    ? kernels::SgdKind::kNesterov
                                               : kernels::SgdKind::kMomentum;
  kernels::LaunchSgd(RatesFor(step), kind, clip_gradient_ > 0, target);
}

}  // namespace dtrain

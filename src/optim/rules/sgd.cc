#include "optim/rules/sgd.h"

#include <string_view>
#include <utility>
#include <vector>

namespace dtrain {
namespace {

// The hyper-parameters of one Update, read once so that the loops below see plain floats.
struct Rates {
  float lr;
  float momentum;
  float wd;
  float rescale;
  float clip;
};

// Options that change the formula are template parameters rather than tests inside the loops:
// the loops then have no branches and the compiler vectorises them.

// The rescaled, maybe clipped, gradient times the learning rate. The unclipped product is formed
// as (lr * rescale) * g, the clipped one as lr * clip(rescale * g), as MXNet's kernels do, so that
// results match MXNet's to the last bit.
template <bool kClip>
inline float ScaledStep(float g, const Rates& r, float lr_rescale) {
  if constexpr (kClip) {
    const float s = r.rescale * g;
    return r.lr * ClipTo(s, r.clip);
  } else {
    return lr_rescale * g;
  }
}

// MXNet's SGDKernel (sgd_update).
template <bool kClip>
void PlainUpdate(const Rates& r, float* __restrict w, const float* __restrict g, size_t n) {
  const float decay = 1.f - r.lr * r.wd;
  const float lr_rescale = r.lr * r.rescale;
  for (size_t i = 0; i < n; ++i) w[i] = decay * w[i] - ScaledStep<kClip>(g[i], r, lr_rescale);
}

// MXNet's SGDMomKernel (sgd_mom_update).
template <bool kClip>
void MomentumUpdate(const Rates& r, float* __restrict w, float* __restrict mom,
                    const float* __restrict g, size_t n) {
  const float lr_wd = r.lr * r.wd;
  const float lr_rescale = r.lr * r.rescale;
  for (size_t i = 0; i < n; ++i) {
    mom[i] = r.momentum * mom[i] - lr_wd * w[i] - ScaledStep<kClip>(g[i], r, lr_rescale);
    w[i] += mom[i];
  }
}

// MXNet's NAGMomKernel (nag_mom_update). Here weight decay joins the gradient before the learning
// rate multiplies both, unlike in the two kernels above.
template <bool kClip>
void NesterovUpdate(const Rates& r, float* __restrict w, float* __restrict mom,
                    const float* __restrict g, size_t n) {
  const float momentum_plus_one = r.momentum + 1.f;
  for (size_t i = 0; i < n; ++i) {
    float s = r.rescale * g[i];
    if constexpr (kClip) s = ClipTo(s, r.clip);
    const float step = r.lr * (s + r.wd * w[i]);
    const float m = r.momentum * mom[i];
    w[i] = w[i] - m + momentum_plus_one * (m - step);
    mom[i] = m - step;
  }
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

void SGD::Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
                StateBuffers state) {
  const Rates r{static_cast<float>(step.learning_rate), momentum_, wd_, rescale_grad_,
                clip_gradient_};
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

}  // namespace dtrain

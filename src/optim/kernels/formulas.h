// Each optimizer's update of one element, as MXNet's kernels compute it, shared by the host's loops
// (src/optim/rules) and the CUDA kernels (device_launch.cu), so that both run the same operations
// in the same order. With no fused multiply-add on either side (-ffp-contract=off for the host,
// -fmad=false for nvcc) and IEEE division and square root (nvcc's default), a GPU's update equals
// the host's bit for bit.
//
// Kept to C++17 and free of the rest of dtrain: nvcc compiles it too.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define DTRAIN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DTRAIN_HOST_DEVICE inline
#endif

namespace dtrain::kernels {

// mshadow's clip to [-bound, bound]: NaN stays NaN. Branch-free once compiled (two selects), so
// the loops that use it vectorise.
DTRAIN_HOST_DEVICE float ClipTo(float x, float bound) {
  return x > bound ? bound : (x < -bound ? -bound : x);
}

// ---- SGD (MXNet's sgd_update, sgd_mom_update, nag_mom_update) ----

struct SgdRates {
  float lr;
  float momentum;
  float wd;
  float rescale;
  float clip;
};

// The rescaled, maybe clipped, gradient times the learning rate. The unclipped product is formed
// as (lr * rescale) * g, the clipped one as lr * clip(rescale * g), as MXNet's kernels do, so that
// results match MXNet's to the last bit.
template <bool kClip>
DTRAIN_HOST_DEVICE float SgdScaledStep(float g, const SgdRates& r) {
  if constexpr (kClip) {
    return r.lr * ClipTo(r.rescale * g, r.clip);
  } else {
    return (r.lr * r.rescale) * g;
  }
}

// MXNet's SGDKernel.
template <bool kClip>
DTRAIN_HOST_DEVICE void SgdPlain(const SgdRates& r, float& w, float g) {
  w = (1.f - r.lr * r.wd) * w - SgdScaledStep<kClip>(g, r);
}

// MXNet's SGDMomKernel.
template <bool kClip>
DTRAIN_HOST_DEVICE void SgdMomentum(const SgdRates& r, float& w, float& mom, float g) {
  mom = r.momentum * mom - (r.lr * r.wd) * w - SgdScaledStep<kClip>(g, r);
  w += mom;
}

// MXNet's NAGMomKernel. Here weight decay joins the gradient before the learning rate multiplies
// both, unlike in the two kernels above.
template <bool kClip>
DTRAIN_HOST_DEVICE void SgdNesterov(const SgdRates& r, float& w, float& mom, float g) {
  float s = r.rescale * g;
  if constexpr (kClip) s = ClipTo(s, r.clip);
  const float step = r.lr * (s + r.wd * w);
  const float m = r.momentum * mom;
  w = w - m + (r.momentum + 1.f) * (m - step);
  mom = m - step;
}

// ---- Adam (MXNet's AdamUpdateKernel) ----

struct AdamRates {
  float lr;  // with the bias correction
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float epsilon, wd, rescale, clip;
};

template <bool kClip>
DTRAIN_HOST_DEVICE void AdamElement(const AdamRates& r, float& w, float& m, float& v, float g) {
  float gr = g * r.rescale + w * r.wd;
  if constexpr (kClip) gr = ClipTo(gr, r.clip);
  m = r.beta1 * m + r.one_minus_beta1 * gr;
  v = r.beta2 * v + r.one_minus_beta2 * gr * gr;
  w = w - r.lr * m / (sqrtf(v) + r.epsilon);
}

// ---- AdaGrad (MXNet's AdaGrad.update for dense arrays) ----

struct AdaGradRates {
  float lr, eps, wd, rescale, clip;
};

// grad * rescale_grad; clip; history += square(grad); div = grad / sqrt(history + eps);
// weight += (div + weight * wd) * -lr. Here the last step is weight - (...) * lr, the same float32
// result.
template <bool kClip>
DTRAIN_HOST_DEVICE void AdaGradElement(const AdaGradRates& r, float& w, float& history, float g) {
  float gr = g * r.rescale;
  if constexpr (kClip) gr = ClipTo(gr, r.clip);
  history = history + gr * gr;
  const float div = gr / sqrtf(history + r.eps);
  w = w - (div + w * r.wd) * r.lr;
}

// ---- RMSProp (MXNet's RMSPropUpdateKernel and RMSPropAlexUpdateKernel) ----

struct RMSPropRates {
  float lr, gamma1, gamma2, one_minus_gamma1, epsilon, wd, rescale, clip, clip_weights;
};

// The gradient both kernels start from: rescaled, weight decay added, then clipped.
template <bool kClip>
DTRAIN_HOST_DEVICE float RMSPropGradient(const RMSPropRates& r, float g, float w) {
  const float gr = r.rescale * g + r.wd * w;
  if constexpr (kClip) return ClipTo(gr, r.clip);
  return gr;
}

template <bool kClip, bool kClipWeights>
DTRAIN_HOST_DEVICE void RMSPropPlain(const RMSPropRates& r, float& w, float& n_avg, float g) {
  const float gr = RMSPropGradient<kClip>(r, g, w);
  n_avg = r.one_minus_gamma1 * (gr * gr) + r.gamma1 * n_avg;
  float weight = w - r.lr * (gr / sqrtf(n_avg + r.epsilon));
  if constexpr (kClipWeights) weight = ClipTo(weight, r.clip_weights);
  w = weight;
}

template <bool kClip, bool kClipWeights>
DTRAIN_HOST_DEVICE void RMSPropCentered(const RMSPropRates& r, float& w, float& n_avg, float& g_avg,
                                        float& delta, float g) {
  const float gr = RMSPropGradient<kClip>(r, g, w);
  n_avg = r.one_minus_gamma1 * gr * gr + r.gamma1 * n_avg;
  g_avg = r.one_minus_gamma1 * gr + r.gamma1 * g_avg;
  delta = r.gamma2 * delta - (r.lr * gr / sqrtf(n_avg - g_avg * g_avg + r.epsilon));
  float weight = w + delta;
  if constexpr (kClipWeights) weight = ClipTo(weight, r.clip_weights);
  w = weight;
}

}  // namespace dtrain::kernels

// RMSProp, exactly as MXNet 1.x's `rmsprop` optimizer and its rmsprop_update (plain, Tieleman &
// Hinton 2012) and rmspropalex_update (centered, Graves 2013) operators compute it, in float32.
//
// Parameters (MXNet's names and defaults):
//   learning_rate  0.001  >= 0 (set_learning_rate changes it later; lr below is the schedule's
//                         rate for the update, lr_schedule.h)
//   gamma1         0.9    in [0, 1), decay of the averages
//   gamma2         0.9    in [0, 1), momentum of the centered variant (unused by the plain one)
//   epsilon        1e-8   >= 0
//   centered       0      0 or 1
//   clip_weights   -1     <= 0 is off; else the new weight is clipped to [-c, c]
//   wd             0      >= 0, weight decay
//   rescale_grad   1      > 0
//   clip_gradient  -1     <= 0 is off; else [-c, c]
//
// With g = clip(rescale_grad * grad + wd * weight) (weight decay IS clipped, unlike SGD's):
//   plain:     n = (1 - gamma1) * g*g + gamma1 * n
//              weight = clip_weights(weight - lr * (g / sqrt(n + epsilon)))
//   centered:  n = (1 - gamma1) * g*g + gamma1 * n
//              gbar = (1 - gamma1) * g + gamma1 * gbar
//              delta = gamma2 * delta - lr * g / sqrt(n - gbar*gbar + epsilon)
//              weight = clip_weights(weight + delta)
// Buffers per element: plain 1 (n); centered 3 (n, gbar, delta). Saved state's name: "rmsprop".
//
// Threads: as Optimizer (optimizer.h).
#pragma once

#include <span>

#include "optim/elementwise_optimizer.h"

namespace dtrain {

class RMSProp final : public ElementwiseOptimizer {
 public:
  // Throws InvalidArgument for an unknown parameter or a value outside the ranges above.
  explicit RMSProp(OptimizerSpec spec);

 private:
  void Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
             StateBuffers state) override;
  void ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) override;
  kernels::RMSPropRates RatesFor(const Step& step) const;

  float gamma1_ = 0.9f;
  float gamma2_ = 0.9f;
  float epsilon_ = 1e-8f;
  bool centered_ = false;
  float clip_weights_ = -1;
  float wd_ = 0;
  float rescale_grad_ = 1;
  float clip_gradient_ = -1;
};

}  // namespace dtrain

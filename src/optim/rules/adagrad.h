// AdaGrad, exactly as MXNet 1.x's `adagrad` optimizer computes it for dense arrays (its Python
// update, float32 array operations).
//
// Parameters (MXNet's names and defaults):
//   learning_rate  0.01  >= 0 (set_learning_rate changes it later; lr below is the schedule's rate
//                        for the update, lr_schedule.h)
//   eps            1e-7  >= 0, also accepted as "epsilon" (not both)
//   wd             0     >= 0, weight decay
//   rescale_grad   1     > 0
//   clip_gradient  -1    <= 0 is off; else [-c, c]
//
//   g        = clip(rescale_grad * grad)                  (weight decay is not clipped)
//   history += g * g
//   weight  -= (g / sqrt(history + eps) + wd * weight) * lr
// Weight decay thus bypasses the adaptive scaling and eps sits inside the square root. MXNet's
// dense path clips whenever clip_gradient is given, even <= 0 (which zeroes or scrambles the
// gradient); here <= 0 is off, as for every other optimizer and MXNet's operators.
// One buffer per element: history. Saved state's name: "adagrad".
//
// Threads: as Optimizer (optimizer.h).
#pragma once

#include <span>

#include "optim/elementwise_optimizer.h"

namespace dtrain {

class AdaGrad final : public ElementwiseOptimizer {
 public:
  // Throws InvalidArgument for an unknown parameter or a value outside the ranges above.
  explicit AdaGrad(OptimizerSpec spec);

 private:
  void Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
             StateBuffers state) override;
  void ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) override;
  kernels::AdaGradRates RatesFor(const Step& step) const;

  float eps_ = 1e-7f;
  float wd_ = 0;
  float rescale_grad_ = 1;
  float clip_gradient_ = -1;
};

}  // namespace dtrain

// Adam, exactly as MXNet 1.x's `adam` optimizer and its adam_update operator compute it: float32
// kernels, the bias correction folded into the learning rate in double precision.
//
// Parameters (MXNet's names and defaults):
//   learning_rate  0.001  >= 0 (set_learning_rate changes it later; lr below is the schedule's
//                         rate for the update, lr_schedule.h)
//   beta1          0.9    in [0, 1)
//   beta2          0.999  in [0, 1)
//   epsilon        1e-8   >= 0
//   wd             0      >= 0, weight decay
//   rescale_grad   1      > 0
//   clip_gradient  -1     <= 0 is off; else [-c, c]
//
// With t the index's update count (1 for its first update):
//   lr_t = lr * (sqrt(1 - beta2^t) / (1 - beta1^t))     (double, then float32)
//   g    = clip(rescale_grad * grad + wd * weight)       (weight decay IS clipped, unlike SGD's)
//   m    = beta1 * m + (1 - beta1) * g
//   v    = beta2 * v + (1 - beta2) * g * g
//   weight -= lr_t * m / (sqrt(v) + epsilon)
// Two buffers per element: m, then v. Saved state's name: "adam".
//
// Threads: as Optimizer (optimizer.h).
#pragma once

#include <span>

#include "optim/elementwise_optimizer.h"

namespace dtrain {

class Adam final : public ElementwiseOptimizer {
 public:
  // Throws InvalidArgument for an unknown parameter or a value outside the ranges above.
  explicit Adam(OptimizerSpec spec);

 private:
  void Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
             StateBuffers state) override;
  void ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) override;
  kernels::AdamRates RatesFor(const Step& step) const;

  // In float32 for the kernel, and as given (double) for the bias correction, as MXNet's Python
  // computes it from its own float.
  float beta1_ = 0.9f;
  float beta2_ = 0.999f;
  double beta1_exact_ = 0.9;
  double beta2_exact_ = 0.999;
  float epsilon_ = 1e-8f;
  float wd_ = 0;
  float rescale_grad_ = 1;
  float clip_gradient_ = -1;
};

}  // namespace dtrain

// SGD with optional momentum and Nesterov momentum, exactly as MXNet's `sgd` optimizer and its
// sgd_update / sgd_mom_update / nag_mom_update operators compute it, in float32.
//
// Parameters (MXNet's names and defaults):
//   learning_rate  0.01  >= 0 (set_learning_rate changes it later; lr below is the schedule's
//                        rate for the update, lr_schedule.h)
//   momentum       0     in [0, 1); 0 keeps no state
//   wd             0     >= 0, weight decay
//   rescale_grad   1     > 0, the gradient is multiplied by it first (e.g. 1/batch size)
//   clip_gradient  -1    <= 0 is off; else the rescaled gradient is clipped to [-c, c]
//   nesterov       0     0 or 1
//
// With g = clip(rescale_grad * grad) (weight decay is added after clipping, never clipped):
//   plain:     weight = (1 - lr*wd) * weight - lr*g
//   momentum:  mom = momentum*mom - lr*wd*weight - lr*g;   weight += mom
//   nesterov:  step = lr*(g + wd*weight);  mom = momentum*mom - step;
//              weight += momentum*mom - step
// The Nesterov form is MXNet's fused nag_mom_update. With a constant learning rate it equals the
// textbook "mom = momentum*mom + g'; weight -= lr*(g' + momentum*mom)" (g' = g + wd*weight), the
// state being -lr times the textbook one; when the rate changes, the momentum keeps the velocity
// taken at the old rate, as MXNet's does.
//
// "nag" is this optimizer with nesterov = 1 (MXNet's NAG optimizer): it takes the same parameters
// but nesterov. Both save state under the name "sgd", with one buffer (the momentum) per element,
// or none when momentum is 0.
//
// Threads: as Optimizer (optimizer.h).
#pragma once

#include <cstdint>
#include <span>

#include "optim/elementwise_optimizer.h"

namespace dtrain {

class SGD final : public ElementwiseOptimizer {
 public:
  // Throws InvalidArgument for an unknown parameter or a value outside the ranges above. `nag`
  // builds MXNet's NAG: Nesterov momentum, no "nesterov" parameter.
  explicit SGD(OptimizerSpec spec, bool nag = false);

 private:
  void Apply(const Step& step, std::span<float> weight, std::span<const float> grad,
             StateBuffers state) override;
  void ApplyOnDevice(const Step& step, const kernels::DeviceTarget& target) override;
  kernels::SgdRates RatesFor(const Step& step) const;

  float momentum_ = 0;
  float wd_ = 0;
  float rescale_grad_ = 1;
  float clip_gradient_ = -1;
  bool nesterov_ = false;
};

}  // namespace dtrain

// SGD with optional momentum and Nesterov momentum, exactly as MXNet's `sgd` optimizer and its
// sgd_update / sgd_mom_update / nag_mom_update operators compute it, in float32.
//
// Parameters (MXNet's names and defaults):
//   learning_rate  0.01  >= 0 (set_learning_rate changes it later)
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
// Threads: Update may run concurrently for different indexes (the state table is locked only to
// find or add an index's momentum; each index's vector never moves), never for the same index.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "optim/optimizer.h"

namespace dtrain {

class SGD final : public Optimizer {
 public:
  // Throws InvalidArgument for an unknown parameter or a value outside the ranges above.
  explicit SGD(OptimizerSpec spec);

  void Update(uint64_t index, std::span<float> weight, std::span<const float> grad) override;

  const OptimizerSpec& spec() const override { return spec_; }
  void set_learning_rate(double learning_rate) override;
  double learning_rate() const override { return learning_rate_.load(); }

 private:
  // The momentum of `index`, created as `n` zeros by the first call.
  std::span<float> MomentumOf(uint64_t index, size_t n);

  const OptimizerSpec spec_;
  std::atomic<float> learning_rate_;
  float momentum_ = 0;
  float wd_ = 0;
  float rescale_grad_ = 1;
  float clip_gradient_ = -1;
  bool nesterov_ = false;

  std::mutex state_mutex_;  // guards the table only, not the vectors in it
  std::unordered_map<uint64_t, std::vector<float>> state_;
};

}  // namespace dtrain

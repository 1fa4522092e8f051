// Learning-rate schedules, as MXNet's FactorScheduler and CosineScheduler (mxnet/lr_scheduler.py)
// compute them, in double precision; the kernels then take the rate as float32, as MXNet's
// operators do.
//
// Chosen by OptimizerSpec::lr_scheduler; parameters in OptimizerSpec::params (MXNet's names with
// an "lr_" prefix):
//   "" (none)  the rate is the base rate
//   "step"     lr_step (required, whole >= 1), lr_factor (1, in [0, 1]),
//              lr_stop_factor_lr or stop_factor_lr (1e-8, >= 0)
//   "cosine"   lr_max_update (required, whole >= 1), lr_final (0, >= 0)
//   both       lr_warmup_steps (0, whole >= 0; < lr_max_update for cosine),
//              lr_warmup_begin (0, in [0, base rate])
// A parameter of a schedule the spec does not choose is refused.
//
// With base = the optimizer's base rate (set_learning_rate changes it), W = lr_warmup_steps and t
// the index's update count (1 for its first update, see optimizer.h):
//   warm-up, t < W:  lr_warmup_begin + (base - lr_warmup_begin) * t / W   (both schedules)
//   step:            k = 0 for t <= lr_step, else floor((t - 1) / lr_step);
//                    base * lr_factor^k, or stop_factor_lr if k >= 1 and that is below it
//   cosine, t <= M:  lr_final + (base - lr_final) * (1 + cos(pi * (t - W) / (M - W))) / 2
//   cosine, t > M:   lr_final          (M = lr_max_update)
// MXNet's schedulers are stateful objects called with the optimizer's update count; these are the
// closed forms of what they return for that count: FactorScheduler multiplies by the factor once
// each time the count passes a multiple of the step (the first drop at step + 1), and
// CosineScheduler keeps its last value, lr_final, after max_update. The one difference: the step
// schedule computes factor^k with pow, where MXNet multiplies k times, which may differ in the last
// bit of the double (never seen in float32 for a realistic k). The warm-up rises to the current
// base rate, where MXNet's rises to the rate the scheduler was built with.
//
// Threads: immutable after construction.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "dtrain/optim/optimizer.h"
#include "optim/optimizer_params.h"

namespace dtrain {

class LearningRateSchedule {
 public:
  // Every parameter name a schedule reads; optimizers accept them besides their own.
  static constexpr std::array<std::string_view, 8> kParamNames = {
      "lr_step",       "lr_factor", "lr_stop_factor_lr", "stop_factor_lr",
      "lr_max_update", "lr_final",  "lr_warmup_steps",   "lr_warmup_begin"};

  // No schedule: RateAt returns the base rate.
  LearningRateSchedule() = default;

  // The schedule `spec` asks for, its parameters read through `params` (a reader of `spec` that
  // accepts kParamNames). `base` is the optimizer's initial base rate, for the warm-up check.
  // Throws InvalidArgument for an unknown schedule, a missing or bad parameter, or a parameter of
  // a schedule not chosen.
  static LearningRateSchedule FromSpec(const OptimizerSpec& spec, const OptimizerParams& params,
                                       double base);

  // The rate of update number `t` (>= 1) given the base rate.
  double RateAt(double base, uint64_t t) const;

 private:
  enum class Kind { kNone, kStep, kCosine };

  Kind kind_ = Kind::kNone;
  uint64_t warmup_steps_ = 0;
  double warmup_begin_ = 0;
  // step
  uint64_t step_ = 1;
  double factor_ = 1;
  double stop_factor_lr_ = 1e-8;
  // cosine
  uint64_t max_update_ = 1;
  double final_lr_ = 0;
};

}  // namespace dtrain

#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <sstream>
#include <string>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

// The parameters only one schedule reads; the warm-up ones belong to both.
constexpr std::string_view kStepOnly[] = {"lr_step", "lr_factor", "lr_stop_factor_lr",
                                          "stop_factor_lr"};
constexpr std::string_view kCosineOnly[] = {"lr_max_update", "lr_final"};
constexpr std::string_view kWarmup[] = {"lr_warmup_steps", "lr_warmup_begin"};

std::string Format(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

[[noreturn]] void Refuse(const OptimizerSpec& spec, const std::string& why) {
  throw InvalidArgument("optimizer '" + spec.name + "': " + why);
}

// Refuses the first of `names` that the spec gives: it belongs to a schedule the spec did not
// choose, and silently ignoring it would train with another rate than the user asked for.
template <size_t N>
void RefuseAny(const OptimizerSpec& spec, const OptimizerParams& params,
               const std::string_view (&names)[N], const std::string& owner) {
  for (std::string_view name : names) {
    if (params.Has(name)) {
      const std::string chosen = spec.lr_scheduler.empty()
                                     ? "no lr_scheduler"
                                     : "lr_scheduler \"" + spec.lr_scheduler + "\"";
      Refuse(spec, "parameter " + std::string(name) + " belongs to " + owner +
                       ", but the spec has " + chosen);
    }
  }
}

}  // namespace

LearningRateSchedule LearningRateSchedule::FromSpec(const OptimizerSpec& spec,
                                                    const OptimizerParams& params, double base) {
  LearningRateSchedule s;
  if (spec.lr_scheduler.empty()) {
    s.kind_ = Kind::kNone;
    RefuseAny(spec, params, kStepOnly, "lr_scheduler \"step\"");
    RefuseAny(spec, params, kCosineOnly, "lr_scheduler \"cosine\"");
    RefuseAny(spec, params, kWarmup, "an lr_scheduler (\"step\" or \"cosine\")");
    return s;
  }
  if (spec.lr_scheduler == "step") {
    s.kind_ = Kind::kStep;
    RefuseAny(spec, params, kCosineOnly, "lr_scheduler \"cosine\"");
    if (!params.Has("lr_step")) Refuse(spec, "lr_scheduler \"step\" needs lr_step");
    s.step_ = params.Count("lr_step", 1, 1);
    params.NonNegative("lr_factor", 1.f);
    s.factor_ = params.Exact("lr_factor", 1.0);
    if (s.factor_ > 1) {
      Refuse(spec, "lr_factor = " + Format(s.factor_) +
                       " is not accepted; it must be in [0, 1] (the rate may only fall)");
    }
    const std::string_view stop = params.OneOf("lr_stop_factor_lr", "stop_factor_lr");
    params.NonNegative(stop, 1e-8f);
    s.stop_factor_lr_ = params.Exact(stop, 1e-8);
  } else if (spec.lr_scheduler == "cosine") {
    s.kind_ = Kind::kCosine;
    RefuseAny(spec, params, kStepOnly, "lr_scheduler \"step\"");
    if (!params.Has("lr_max_update")) Refuse(spec, "lr_scheduler \"cosine\" needs lr_max_update");
    s.max_update_ = params.Count("lr_max_update", 1, 1);
    params.NonNegative("lr_final", 0.f);
    s.final_lr_ = params.Exact("lr_final", 0.0);
  } else {
    Refuse(spec, "unknown lr_scheduler \"" + spec.lr_scheduler +
                     "\"; known: \"step\", \"cosine\", or \"\" for none");
  }
  s.warmup_steps_ = params.Count("lr_warmup_steps", 0, 0);
  params.NonNegative("lr_warmup_begin", 0.f);
  s.warmup_begin_ = params.Exact("lr_warmup_begin", 0.0);
  if (s.warmup_begin_ > base) {
    Refuse(spec, "lr_warmup_begin = " + Format(s.warmup_begin_) + " is above the learning rate " +
                     Format(base) + "; a warm-up rises to the learning rate");
  }
  if (s.kind_ == Kind::kCosine && s.warmup_steps_ >= s.max_update_) {
    // MXNet divides by max_update - warmup_steps.
    Refuse(spec, "lr_warmup_steps = " + std::to_string(s.warmup_steps_) +
                     " must be below lr_max_update = " + std::to_string(s.max_update_));
  }
  return s;
}

double LearningRateSchedule::RateAt(double base, uint64_t t) const {
  if (kind_ == Kind::kNone) return base;
  // The operations and their order are MXNet's, so that the doubles agree to the bit.
  if (t < warmup_steps_) {
    const double increase =
        (base - warmup_begin_) * static_cast<double>(t) / static_cast<double>(warmup_steps_);
    return warmup_begin_ + increase;
  }
  if (kind_ == Kind::kStep) {
    const uint64_t k = t <= step_ ? 0 : (t - 1) / step_;
    if (k == 0) return base;
    const double rate = base * std::pow(factor_, static_cast<double>(k));
    return rate < stop_factor_lr_ ? stop_factor_lr_ : rate;
  }
  if (t > max_update_) return final_lr_;
  const double progress = static_cast<double>(t - warmup_steps_);
  const double span = static_cast<double>(max_update_ - warmup_steps_);
  return final_lr_ + (base - final_lr_) * (1 + std::cos(std::numbers::pi * progress / span)) / 2;
}

}  // namespace dtrain

// Reading an optimizer's numeric parameters out of an OptimizerSpec, with the checks that every
// optimizer shares, so that each one states only its names, defaults and ranges.
//
// Specs arrive from users and from the network: every problem is an InvalidArgument whose message
// names the optimizer, the parameter, the value and what would be accepted. Values are returned as
// float32, the precision the update kernels run in (as MXNet's operators do), except by Exact and
// Count, for the values that MXNet's Python computes with in double precision (learning rates and
// their schedules, Adam's bias correction).
//
// Threads: a reader is used while one optimizer is being built; not shared.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/optim/optimizer.h"

namespace dtrain {

class OptimizerParams {
 public:
  // Throws InvalidArgument naming the first parameter of `spec` that is not in `accepted`, and
  // listing the accepted ones. `spec` must outlive the reader.
  OptimizerParams(const OptimizerSpec& spec, std::vector<std::string_view> accepted);

  bool Has(std::string_view name) const;

  // The parameter's value, or `fallback` when the spec leaves it out. Each throws InvalidArgument
  // when the value is not finite in float32 or outside the range its name states: NonNegative
  // >= 0, Positive > 0, InRange [low, high), Flag 0 or 1.
  float Any(std::string_view name, float fallback) const;
  float NonNegative(std::string_view name, float fallback) const;
  float Positive(std::string_view name, float fallback) const;
  float InRange(std::string_view name, float fallback, float low, float high) const;
  bool Flag(std::string_view name, bool fallback) const;

  // The value exactly as the spec gives it (double), after the check Any makes. Read a range
  // first with one of the float readers above, which throws for a value outside it.
  double Exact(std::string_view name, double fallback) const;
  // A whole number in [low, 2^53] (a number of updates): throws for a fraction or a value outside.
  uint64_t Count(std::string_view name, uint64_t fallback, uint64_t low) const;
  // Which of two names for one parameter the spec uses (`name` when neither). Throws
  // InvalidArgument when it gives both.
  std::string_view OneOf(std::string_view name, std::string_view alias) const;

 private:
  [[noreturn]] void Reject(std::string_view name, double value, std::string_view must) const;

  const OptimizerSpec& spec_;
};

}  // namespace dtrain

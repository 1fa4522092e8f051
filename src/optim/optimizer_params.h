// Reading an optimizer's numeric parameters out of an OptimizerSpec, with the checks that every
// optimizer shares, so that each one states only its names, defaults and ranges.
//
// Specs arrive from users and from the network: every problem is an InvalidArgument whose message
// names the optimizer, the parameter, the value and what would be accepted. Values are returned as
// float32, the precision the update kernels run in (as MXNet's operators do).
//
// Threads: a reader is used while one optimizer is being built; not shared.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "optim/optimizer.h"

namespace dtrain {

class OptimizerParams {
 public:
  // Throws InvalidArgument naming the first parameter of `spec` that is not in `accepted`, and
  // listing the accepted ones.
  OptimizerParams(const OptimizerSpec& spec, std::initializer_list<std::string_view> accepted);

  // The parameter's value, or `fallback` when the spec leaves it out. Each throws InvalidArgument
  // when the value is not finite in float32 or outside the range its name states: NonNegative
  // >= 0, Positive > 0, InRange [low, high), Flag 0 or 1.
  float Any(std::string_view name, float fallback) const;
  float NonNegative(std::string_view name, float fallback) const;
  float Positive(std::string_view name, float fallback) const;
  float InRange(std::string_view name, float fallback, float low, float high) const;
  bool Flag(std::string_view name, bool fallback) const;

 private:
  [[noreturn]] void Reject(std::string_view name, double value, std::string_view must) const;

  const OptimizerSpec& spec_;
};

}  // namespace dtrain

#include "optim/optimizer_params.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/error.h"

namespace dtrain {
namespace {

std::string FormatNumber(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

OptimizerParams::OptimizerParams(const OptimizerSpec& spec,
                                 std::initializer_list<std::string_view> accepted)
    : spec_(spec) {
  for (const auto& [name, value] : spec.params) {
    if (std::find(accepted.begin(), accepted.end(), name) != accepted.end()) continue;
    std::string list;
    for (std::string_view a : accepted) list += (list.empty() ? "" : ", ") + std::string(a);
    throw InvalidArgument("optimizer '" + spec.name + "' has no parameter '" + name +
                          "'; it accepts: " + list);
  }
}

float OptimizerParams::Any(std::string_view name, float fallback) const {
  auto it = spec_.params.find(std::string(name));
  if (it == spec_.params.end()) return fallback;
  const double value = it->second;
  // A finite double can still overflow float32 (1e300) and turn the weights into infinities.
  if (!std::isfinite(value) || std::fabs(value) > std::numeric_limits<float>::max()) {
    Reject(name, value, "be a finite float32 number");
  }
  return static_cast<float>(value);
}

float OptimizerParams::NonNegative(std::string_view name, float fallback) const {
  const float value = Any(name, fallback);
  if (value < 0) Reject(name, value, "be >= 0");
  return value;
}

float OptimizerParams::Positive(std::string_view name, float fallback) const {
  const float value = Any(name, fallback);
  if (value <= 0) Reject(name, value, "be > 0");
  return value;
}

float OptimizerParams::InRange(std::string_view name, float fallback, float low, float high) const {
  const float value = Any(name, fallback);
  if (value < low || value >= high) {
    Reject(name, value, "be in [" + FormatNumber(low) + ", " + FormatNumber(high) + ")");
  }
  return value;
}

bool OptimizerParams::Flag(std::string_view name, bool fallback) const {
  const float value = Any(name, fallback ? 1.0f : 0.0f);
  if (value != 0 && value != 1) Reject(name, value, "be 0 or 1");
  return value == 1;
}

void OptimizerParams::Reject(std::string_view name, double value, std::string_view must) const {
  throw InvalidArgument("optimizer '" + spec_.name + "': " + std::string(name) + " = " +
                        FormatNumber(value) + " is not accepted; it must " + std::string(must));
}

}  // namespace dtrain

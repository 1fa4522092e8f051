#include "optim/optimizer_params.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

std::string FormatNumber(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

OptimizerParams::OptimizerParams(const OptimizerSpec& spec, std::vector<std::string_view> accepted)
    : spec_(spec) {
  for (const auto& [name, value] : spec.params) {
    if (std::find(accepted.begin(), accepted.end(), name) != accepted.end()) continue;
    std::string list;
    for (std::string_view a : accepted) list += (list.empty() ? "" : ", ") + std::string(a);
    throw InvalidArgument("optimizer '" + spec.name + "' has no parameter '" + name +
                          "'; it accepts: " + list);
  }
}

bool OptimizerParams::Has(std::string_view name) const {
  return spec_.params.find(std::string(name)) != spec_.params.end();
}

double OptimizerParams::Exact(std::string_view name, double fallback) const {
  auto it = spec_.params.find(std::string(name));
  if (it == spec_.params.end()) return fallback;
  const double value = it->second;
  // A finite double can still overflow float32 (1e300) and turn the weights into infinities.
  if (!std::isfinite(value) || std::fabs(value) > std::numeric_limits<float>::max()) {
    Reject(name, value, "be a finite float32 number");
  }
  return value;
}

float OptimizerParams::Any(std::string_view name, float fallback) const {
  return static_cast<float>(Exact(name, fallback));
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

uint64_t OptimizerParams::Count(std::string_view name, uint64_t fallback, uint64_t low) const {
  constexpr double kMax = 9007199254740992.0;  // 2^53: every whole number below is a double
  auto it = spec_.params.find(std::string(name));
  if (it == spec_.params.end()) return fallback;
  const double value = it->second;
  if (!(value >= static_cast<double>(low) && value <= kMax) || std::floor(value) != value) {
    Reject(name, value, "be a whole number in [" + std::to_string(low) + ", 2^53]");
  }
  return static_cast<uint64_t>(value);
}

std::string_view OptimizerParams::OneOf(std::string_view name, std::string_view alias) const {
  const bool has_name = Has(name);
  if (has_name && Has(alias)) {
    throw InvalidArgument("optimizer '" + spec_.name + "': " + std::string(name) + " and " +
                          std::string(alias) + " are two names for one parameter; give one");
  }
  return has_name || !Has(alias) ? name : alias;
}

void OptimizerParams::Reject(std::string_view name, double value, std::string_view must) const {
  throw InvalidArgument("optimizer '" + spec_.name + "': " + std::string(name) + " = " +
                        FormatNumber(value) + " is not accepted; it must " + std::string(must));
}

}  // namespace dtrain

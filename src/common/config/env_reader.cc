#include "common/config/env_reader.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "common/config/variables.h"
#include "dtrain/common/error.h"

namespace dtrain {
namespace {

bool AllDigits(const std::string& text, size_t from) {
  if (from >= text.size()) return false;
  for (size_t i = from; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

template <typename T>
std::string RangeText(const std::string& name, const std::string& text, T min, T max) {
  std::ostringstream out;
  out << name << "=" << text << " is out of range [" << min << ", " << max << "]";
  return out.str();
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup MapEnvironment(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

EnvReader::EnvReader(EnvLookup env) : env_(std::move(env)) {}

std::optional<std::string> EnvReader::Text(const std::string& name) const {
  auto v = TextAsSet(name);
  if (v && v->empty()) return std::nullopt;  // NAME= counts as unset, as in the shell
  return v;
}

std::optional<std::string> EnvReader::TextAsSet(const std::string& name) const {
  if (!IsKnownVariable(name)) {
    throw std::logic_error(name + " is read but missing from common/config/variables.cc");
  }
  return env_(name);
}

std::optional<std::pair<std::string, std::string>> EnvReader::First(
    std::initializer_list<const char*> names) const {
  for (const char* name : names) {
    if (auto v = Text(name)) return std::make_pair(std::string(name), *v);
  }
  return std::nullopt;
}

int64_t EnvReader::ParseInteger(const std::string& name, const std::string& text, int64_t min,
                                int64_t max) {
  if (!AllDigits(text, text[0] == '-' ? 1 : 0)) {
    throw ConfigError(name + "='" + text + "' is not an integer");
  }
  errno = 0;
  const long long value = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || value < min || value > max) {
    throw ConfigError(RangeText(name, text, min, max));
  }
  return value;
}

double EnvReader::ParseDecimal(const std::string& name, const std::string& text, double min,
                               double max) {
  const size_t dot = text.find('.');
  std::string digits = text;
  if (dot != std::string::npos) digits.erase(dot, 1);
  // Digits and at most one '.': no signs, spaces, exponents or hex, which strtod would accept.
  if (!AllDigits(digits, 0)) throw ConfigError(name + "='" + text + "' is not a decimal number");
  errno = 0;
  const double value = std::strtod(text.c_str(), nullptr);
  if (errno == ERANGE || value < min || value > max) {
    throw ConfigError(RangeText(name, text, min, max));
  }
  return value;
}

std::optional<int64_t> EnvReader::Integer(const std::string& name, int64_t min, int64_t max) const {
  auto text = Text(name);
  if (!text) return std::nullopt;
  return ParseInteger(name, *text, min, max);
}

std::optional<double> EnvReader::Decimal(const std::string& name, double min, double max) const {
  auto text = Text(name);
  if (!text) return std::nullopt;
  return ParseDecimal(name, *text, min, max);
}

std::optional<bool> EnvReader::Boolean(const std::string& name) const {
  auto text = Text(name);
  if (!text) return std::nullopt;
  if (*text == "1" || *text == "true" || *text == "TRUE" || *text == "yes") return true;
  if (*text == "0" || *text == "false" || *text == "FALSE" || *text == "no") return false;
  throw ConfigError(name + "='" + *text + "' is not a boolean (use 0 or 1)");
}

std::optional<std::string> EnvReader::Choice(const std::string& name,
                                             std::initializer_list<const char*> words) const {
  auto text = Text(name);
  if (!text) return std::nullopt;
  std::string listed;
  for (const char* word : words) {
    if (*text == word) return text;
    listed += (listed.empty() ? "" : ", ") + std::string(word);
  }
  throw ConfigError(name + "='" + *text + "' is not one of " + listed);
}

void EnvReader::Millis(const std::string& name, Duration* out, int64_t min) const {
  if (auto v = Integer(name, min, int64_t{1} << 40)) *out = Duration(*v);
}

}  // namespace dtrain

// The one reader of environment variables, with one grammar for every variable dtrain reads
// (common/config/config.cc reads a process's configuration with it, `dtrain launch` the few
// variables it decides on and the `dtrain` command DTRAIN_PYTHON; the table of variables is
// common/config/variables.cc):
//   - NAME= (set but empty) counts as unset, as in the shell;
//   - an integer is an optional '-' and decimal digits, nothing else (no spaces, '+', hex or
//     exponent), within the range the variable allows;
//   - a decimal number is digits with at most one '.', within its range;
//   - a boolean is 1/0, true/false, TRUE/FALSE or yes/no;
//   - a choice is one of the listed words.
// A value that does not parse is a ConfigError naming the variable and the value. Reading a name
// that is not in the table is a std::logic_error: every variable is documented.
//
// Threads: one reader per thread; the lookup function must be safe to call.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "dtrain/common/deadline.h"

namespace dtrain {

// Looks a variable up; returns nullopt when unset. Lets tests supply an environment of their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

EnvLookup ProcessEnvironment();
EnvLookup MapEnvironment(std::map<std::string, std::string> vars);

class EnvReader {
 public:
  explicit EnvReader(EnvLookup env);

  std::optional<std::string> Text(const std::string& name) const;
  // As set, "" included: for the variables where NAME= must not quietly mean unset.
  std::optional<std::string> TextAsSet(const std::string& name) const;
  // The first of `names` that is set, with the name it came from (Horovod's names as fallbacks).
  std::optional<std::pair<std::string, std::string>> First(
      std::initializer_list<const char*> names) const;

  std::optional<int64_t> Integer(const std::string& name, int64_t min, int64_t max) const;
  std::optional<double> Decimal(const std::string& name, double min, double max) const;
  std::optional<bool> Boolean(const std::string& name) const;
  std::optional<std::string> Choice(const std::string& name,
                                    std::initializer_list<const char*> words) const;
  // Milliseconds, at least `min`, into *out if set.
  void Millis(const std::string& name, Duration* out, int64_t min = 1) const;

  // The same grammar on a value already looked up (for First's results).
  static int64_t ParseInteger(const std::string& name, const std::string& text, int64_t min,
                              int64_t max);
  static double ParseDecimal(const std::string& name, const std::string& text, double min,
                             double max);

 private:
  EnvLookup env_;
};

}  // namespace dtrain

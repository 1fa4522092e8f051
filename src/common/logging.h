// Line-oriented logging to stderr, controlled by PS_VERBOSE.
//
// Level 0 (default): warnings and errors only. PS_VERBOSE=1: connections and the configuration in
// effect. PS_VERBOSE=2: every message. Each line starts with the process's identity ("[worker 1]"
// etc. once known) so that merged output from many nodes stays readable. Thread-safe.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace dtrain {

enum class LogLevel { kError = -2, kWarning = -1, kInfo = 0, kConnections = 1, kMessages = 2 };

void SetLogVerbosity(int verbosity);
int LogVerbosity();
void SetLogIdentity(std::string identity);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, std::string_view text);

namespace internal {
class LogStream {
 public:
  explicit LogStream(LogLevel level) : level_(level) {}
  ~LogStream() { LogLine(level_, stream_.str()); }
  template <typename T>
  LogStream& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace dtrain

namespace dtrain::internal {
// Lets the macro below be a single expression, safe inside an unbraced if/else.
struct LogVoidify {
  void operator&(const LogStream&) {}
};
}  // namespace dtrain::internal

#define DTRAIN_LOG(level)                                     \
  !::dtrain::LogEnabled(::dtrain::LogLevel::level)            \
      ? (void)0                                               \
      : ::dtrain::internal::LogVoidify() &                    \
            ::dtrain::internal::LogStream(::dtrain::LogLevel::level)

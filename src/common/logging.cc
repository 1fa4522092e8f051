#include "common/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace dtrain {
namespace {

std::atomic<int> g_verbosity{0};
std::mutex g_mutex;
std::string g_identity;  // guarded by g_mutex

const char* LevelTag(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kWarning:
      return "WARN";
    default:
      return "INFO";
  }
}

}  // namespace

void SetLogVerbosity(int verbosity) { g_verbosity.store(verbosity); }
int LogVerbosity() { return g_verbosity.load(); }

void SetLogIdentity(std::string identity) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_identity = std::move(identity);
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= g_verbosity.load(); }

void LogLine(LogLevel level, std::string_view text) {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::system_clock::to_time_t(now);
  int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "%s.%03d %s dtrain%s%s: %.*s\n", stamp, millis, LevelTag(level),
               g_identity.empty() ? "" : " ", g_identity.c_str(), static_cast<int>(text.size()),
               text.data());
  std::fflush(stderr);
}

}  // namespace dtrain

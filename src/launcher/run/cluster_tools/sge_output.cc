#include "launcher/run/cluster_tools/sge_output.h"

#include <signal.h>
#include <string.h>

#include <regex>

namespace dtrain::launcher {

std::optional<TaskFailure> QsubOutputParser::FailureIn(std::string_view tool_line) {
  static const std::regex terse_id(R"(^(\d{1,12})(\.\d+-\d+:\d+)?\s*$)");
  static const std::regex submitted(R"(^Your job(-array)? (\d{1,12}))");
  static const std::regex exited(R"(^Job \d+\.(\d{1,9}) exited with exit code (\d{1,3}))");
  static const std::regex signaled(R"(^Job \d+\.(\d{1,9}) exited because of signal (SIG)?(\w+))");
  static const std::regex unable(R"(^Unable to run job \d+\.(\d{1,9}))");
  const std::string line(tool_line);
  std::smatch m;
  if (job_id_.empty()) {
    if (std::regex_search(line, m, terse_id)) {
      job_id_ = m[1];
      return std::nullopt;
    }
    if (std::regex_search(line, m, submitted)) {
      job_id_ = m[2];
      return std::nullopt;
    }
  }
  if (std::regex_search(line, m, exited)) {
    const int code = std::stoi(m[2]);
    if (code == 0) return std::nullopt;
    return TaskFailure{std::stoi(m[1]) - 1, code, "exited with code " + std::to_string(code)};
  }
  if (std::regex_search(line, m, signaled)) {
    const std::string name = m[3];
    for (int sig = 1; sig < NSIG; ++sig) {
      const char* abbrev = ::sigabbrev_np(sig);
      if (abbrev == nullptr || name != abbrev) continue;
      return TaskFailure{std::stoi(m[1]) - 1, 128 + sig,
                         "was killed by signal " + std::to_string(sig) + " (SIG" + name + ")"};
    }
    return TaskFailure{std::stoi(m[1]) - 1, 1, "was killed by signal " + name};
  }
  if (std::regex_search(line, m, unable)) {
    return TaskFailure{std::stoi(m[1]) - 1, 1, "could not be run by Grid Engine"};
  }
  return std::nullopt;
}

std::vector<std::string> QsubOutputParser::CancelCommand() const {
  if (job_id_.empty()) return {};
  return {qdel_, job_id_};
}

}  // namespace dtrain::launcher

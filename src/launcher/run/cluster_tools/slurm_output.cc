#include "launcher/run/cluster_tools/slurm_output.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <regex>

namespace dtrain::launcher {

void SrunOutputParser::OnLine(std::string_view line, bool from_stderr, const Sink& sink) {
  // "  12: text": optional padding, the rank, ": ". Anything else is srun's own.
  size_t i = 0;
  while (i < line.size() && line[i] == ' ') ++i;
  const size_t digits = i;
  int rank = 0;
  while (i < line.size() && i - digits < 9 && line[i] >= '0' && line[i] <= '9') {
    rank = rank * 10 + (line[i] - '0');
    ++i;
  }
  const std::string_view rest = line.substr(i);
  if (i > digits && (rest.substr(0, 2) == ": " || rest == ":")) {
    std::string text(rest.substr(std::min<size_t>(2, rest.size())));
    text += '\n';
    sink.task_output(rank, from_stderr, text);
    return;
  }
  sink.tool_line(line, from_stderr);
}

std::optional<TaskFailure> SrunOutputParser::FailureIn(std::string_view tool_line) {
  static const std::regex ended(R"(^srun: error: \S+: tasks? (\d{1,9})[-,0-9]*: (.+)$)");
  static const std::regex exit_code(R"(^Exited with exit code (\d{1,3}))");
  const std::string line(tool_line);
  std::smatch m;
  if (!std::regex_search(line, m, ended)) return std::nullopt;
  const int task = std::stoi(m[1]);
  std::string how = m[2];
  std::smatch code;
  if (std::regex_search(how, code, exit_code)) {
    const int c = std::stoi(code[1]);
    return TaskFailure{task, c, "exited with code " + std::to_string(c)};
  }
  const std::string core = " (core dumped)";
  if (how.size() > core.size() && how.compare(how.size() - core.size(), core.size(), core) == 0) {
    how.erase(how.size() - core.size());
  }
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* text = ::strsignal(sig);
    if (text == nullptr || how != text) continue;
    const char* abbrev = ::sigabbrev_np(sig);
    return TaskFailure{
        task, 128 + sig,
        "was killed by signal " + std::to_string(sig) + " (SIG" + (abbrev ? abbrev : "?") + ")"};
  }
  return TaskFailure{task, 1, "ended: " + how};
}

}  // namespace dtrain::launcher

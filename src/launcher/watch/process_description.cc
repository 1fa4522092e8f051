#include "launcher/watch/process_description.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

namespace dtrain::launcher {

std::string DescribeProcess(const ProcessSpec& spec, pid_t pid) {
  if (spec.remote_via.empty()) return spec.Name() + " (pid " + std::to_string(pid) + ")";
  return spec.Name() + " on " + spec.host + " (" + spec.remote_via + " pid " + std::to_string(pid) +
         ")";
}

bool SshFailed(const ProcessSpec& spec, const ExitStatus& status) {
  return spec.remote_via == "ssh" && WIFEXITED(status.wait_status) &&
         WEXITSTATUS(status.wait_status) == 255;
}

bool DiedBySignal(const ProcessSpec& spec, const ExitStatus& status) {
  if (WIFSIGNALED(status.wait_status)) return true;
  const int code = status.ShellCode();
  return !spec.remote_via.empty() && code > 128 && code < 128 + NSIG;
}

std::string DescribeExit(const ProcessSpec& spec, const ExitStatus& status) {
  std::string text = status.Describe();
  if (SshFailed(spec, status)) {
    return text + " (ssh itself failed: cannot connect or log in, or the connection was lost)";
  }
  if (spec.remote_via != "ssh" || !WIFEXITED(status.wait_status)) return text;
  const int code = WEXITSTATUS(status.wait_status);
  if (code > 128 && code < 128 + NSIG) {
    const char* abbrev = ::sigabbrev_np(code - 128);
    text += ": the remote process was killed by signal " + std::to_string(code - 128) + " (SIG" +
            (abbrev != nullptr ? abbrev : "?") + ")";
  }
  return text;
}

}  // namespace dtrain::launcher

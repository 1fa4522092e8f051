#include "launcher/run/host_discovery.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtrain/common/error.h"

extern char** environ;

namespace dtrain::launcher {
namespace {

constexpr size_t kMaxOutputBytes = size_t{1} << 20;

bool HasHosts(const std::string& text) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line[first] != '#') return true;
    start = end + 1;
  }
  return false;
}

// Reads `fd` to its end, at most kMaxOutputBytes, until `deadline`. False when the time ran out.
bool ReadAll(int fd, const Deadline& deadline, std::string* out, bool* too_long) {
  char buffer[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(deadline.left().count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    if (out->size() + static_cast<size_t>(n) > kMaxOutputBytes) {
      *too_long = true;
      return true;
    }
    out->append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace

std::vector<HostEntry> ParseDiscoveredHosts(const std::string& text) {
  if (!HasHosts(text)) return {};
  return ParseHostfile(text, "the host discovery script's output");
}

std::vector<HostEntry> DiscoverHosts(const std::string& script, Duration timeout) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  // Its own process group, so that a script past its deadline is stopped with its children.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &actions, &attr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    throw Error("cannot run the host discovery script: " + std::string(std::strerror(rc)));
  }
  const Deadline deadline(timeout);
  std::string output;
  bool too_long = false;
  const bool finished = ReadAll(pipe_fds[0], deadline, &output, &too_long);
  ::close(pipe_fds[0]);
  if (!finished || too_long) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!finished) {
    throw Error("the host discovery script ran longer than " +
                std::to_string(static_cast<int>(Seconds(timeout))) + " s; it was stopped");
  }
  if (too_long) throw Error("the host discovery script printed more than 1 MiB");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error("the host discovery script failed (" +
                (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                   : "signal " + std::to_string(WTERMSIG(status))) +
                ")");
  }
  return ParseDiscoveredHosts(output);
}

}  // namespace dtrain::launcher

#include "launcher/run/process_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "dtrain/common/error.h"

extern char** environ;

namespace dtrain::launcher {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// A child created with a closed 0, 1 or 2 would get its pipes there, and the dup2 dance in the
// child would clobber them; a launcher started that way gets /dev/null in the holes instead.
void EnsureStandardFdsOpen() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) ::close(null_fd);
    }
  }
}

// The launcher's environment with `overrides` applied; a later override of the same name wins.
std::vector<std::string> ChildEnvironment(const std::vector<EnvVar>& overrides) {
  std::map<std::string, std::string> vars;
  std::vector<std::string> order;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    if (vars.emplace(name, entry.substr(eq + 1)).second) order.push_back(name);
  }
  for (const auto& [name, value] : overrides) {
    if (vars.count(name) == 0) order.push_back(name);
    vars[name] = value;
  }
  std::vector<std::string> out;
  out.reserve(order.size());
  for (const std::string& name : order) out.push_back(name + "=" + vars[name]);
  return out;
}

// execvp's search, done before fork so the child only has to call execve.
std::string ResolveExecutable(const std::string& name, const std::vector<std::string>& env) {
  if (name.find('/') != std::string::npos) return name;
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& e : env) {
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return name;  // execve fails with ENOENT and the child reports it
}

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

Pipe MakePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(Errno("pipe"));
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Runs in the child between fork and exec: only system calls, no allocation.
[[noreturn]] void ExecChild(pid_t launcher_pid, pid_t pgid, int in_fd, int out_fd, int err_fd,
                            const char* path, char* const argv[], char* const envp[],
                            const char* exec_error_prefix) {
  // Join (or found) the job's process group before anything can signal the group.
  ::setpgid(0, pgid);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher may have died before prctl took effect; then nobody would kill us.
  if (::getppid() != launcher_pid) ::_exit(1);

  // The launcher's handlers (asio's) must not run here, and exec keeps ignored signals ignored.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  // All three are >= 3 (EnsureStandardFdsOpen), so dup2 never closes one we still need; the
  // copies lose O_CLOEXEC, the originals are closed by exec.
  ::dup2(in_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);

  ::execve(path, argv, envp);
  const int err = errno;
  const char* reason = std::strerror(err);
  (void)!::write(2, exec_error_prefix, std::strlen(exec_error_prefix));
  (void)!::write(2, reason, std::strlen(reason));
  (void)!::write(2, "\n", 1);
  ::_exit(err == ENOENT ? 127 : 126);
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

bool ExitStatus::succeeded() const {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

int ExitStatus::ShellCode() const {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string ExitStatus::Describe() const {
  if (WIFEXITED(wait_status)) return "exited with code " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = ::sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + " (SIG" +
           (abbrev != nullptr ? abbrev : "?") + ")";
  }
  return "ended with wait status " + std::to_string(wait_status);
}

LocalProcessGroup::~LocalProcessGroup() {
  if (pgid_ <= 0) return;
  Signal(SIGKILL);
  SignalStrays(SIGKILL);
}

StartedProcess LocalProcessGroup::Start(const ProcessSpec& spec) {
  if (spec.argv.empty()) throw Error("empty command");
  EnsureStandardFdsOpen();

  // Everything the child needs is built here, before fork.
  std::vector<std::string> env = ChildEnvironment(spec.env);
  const std::string path = ResolveExecutable(spec.argv[0], env);
  std::vector<char*> argv_ptrs;
  for (const std::string& a : spec.argv) argv_ptrs.push_back(const_cast<char*>(a.c_str()));
  argv_ptrs.push_back(nullptr);
  std::vector<char*> env_ptrs;
  for (const std::string& e : env) env_ptrs.push_back(const_cast<char*>(e.c_str()));
  env_ptrs.push_back(nullptr);
  const std::string exec_error_prefix = "dtrain launch: cannot run '" + spec.argv[0] + "': ";

  UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (null_fd.get() < 0) throw Error(Errno("open /dev/null"));
  Pipe in;
  if (spec.stdin_held_open) in = MakePipe();
  const int stdin_fd = spec.stdin_held_open ? in.read.get() : null_fd.get();
  Pipe out = MakePipe();
  Pipe err = MakePipe();

  // Signals stay blocked across fork so that none reaches the child while it still has the
  // launcher's handlers; the child unblocks them after resetting the handlers.
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  const pid_t launcher_pid = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ExecChild(launcher_pid, pgid_, stdin_fd, out.write.get(), err.write.get(), path.c_str(),
              argv_ptrs.data(), env_ptrs.data(), exec_error_prefix.c_str());
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) {
    errno = fork_errno;
    throw Error(Errno("fork"));
  }
  if (pgid_ == 0) pgid_ = pid;
  unreaped_.push_back(pid);
  // Also from this side, so the child is in the group by the time we might signal it; EACCES
  // after the child's exec is harmless (it did it itself).
  ::setpgid(pid, pgid_);

  StartedProcess started;
  started.pid = pid;
  started.stdout_read = std::move(out.read);
  started.stderr_read = std::move(err.read);
  started.stdin_write = std::move(in.write);
  return started;
}

bool LocalProcessGroup::Signal(int sig) {
  if (pgid_ <= 0) return false;
  return ::kill(-pgid_, sig) == 0;
}

bool LocalProcessGroup::HasMembers() const {
  if (pgid_ <= 0) return false;
  return ::kill(-pgid_, 0) == 0 || errno == EPERM;
}

std::optional<ExitStatus> LocalProcessGroup::ReapOne() {
  if (pgid_ <= 0) return std::nullopt;
  int status = 0;
  pid_t pid;
  // Only our own job: the launcher's code may share its process with other children (tests).
  do {
    pid = ::waitpid(-pgid_, &status, WNOHANG);
  } while (pid < 0 && errno == EINTR);
  if (pid <= 0) {
    // The slow path, for processes that left the group.
    for (pid_t p : unreaped_) {
      if (::getpgid(p) == pgid_) continue;
      do {
        pid = ::waitpid(p, &status, WNOHANG);
      } while (pid < 0 && errno == EINTR);
      if (pid > 0) break;
    }
  }
  if (pid <= 0) return std::nullopt;
  unreaped_.erase(std::remove(unreaped_.begin(), unreaped_.end(), pid), unreaped_.end());
  return ExitStatus{pid, status};
}

void LocalProcessGroup::SignalStrays(int sig) {
  for (pid_t p : unreaped_) {
    if (::getpgid(p) != pgid_) ::kill(p, sig);
  }
}

std::string SelfExecutablePath() {
  std::vector<char> buf(4096);
  ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n < 0) throw Error(Errno("readlink /proc/self/exe"));
  return std::string(buf.data(), static_cast<size_t>(n));
}

}  // namespace dtrain::launcher

// Starting, signalling and reaping the processes of one job on this machine.
//
// All processes of a job share one new process group, so that kill(-pgid) also reaches what they
// started themselves (the shell of `sh -c`, `sleep &` in a worker script). Each child asks the
// kernel to SIGKILL it when the launcher dies (PR_SET_PDEATHSIG), so a launcher killed with SIGKILL
// leaves no orphans behind among its direct children.
//
// Threads: not thread-safe. Start() must be called from a thread that lives as long as the job
// (PR_SET_PDEATHSIG fires when the *thread* that forked exits), normally the launcher's main
// thread, and while no other thread of the process runs (between fork and exec the child only
// resets signals, moves descriptors and execs, but that is only safe in a single-threaded
// process).
//
// Ownership: the group owns its processes. Its destructor SIGKILLs any member still alive, as a
// last resort when the supervisor could not stop the job in order (e.g. an exception).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "launcher/plan/job_plan.h"

namespace dtrain::launcher {

// A file descriptor closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// How a process ended, as waitpid reported it.
struct ExitStatus {
  pid_t pid = 0;
  int wait_status = 0;

  bool succeeded() const;  // exited with code 0
  // The exit code a shell would report: the code, or 128 + signal number.
  int ShellCode() const;
  // "exited with code 3" / "was killed by signal 9 (SIGKILL)".
  std::string Describe() const;
};

// A started process: its pid and the read ends of its stdout and stderr pipes (non-blocking is
// left to the reader), and for spec.stdin_held_open the write end of its stdin (close-on-exec, so
// no other child inherits it; closing it is the child's EOF).
struct StartedProcess {
  pid_t pid = 0;
  UniqueFd stdout_read;
  UniqueFd stderr_read;
  UniqueFd stdin_write;
};

class LocalProcessGroup {
 public:
  LocalProcessGroup() = default;
  ~LocalProcessGroup();
  LocalProcessGroup(const LocalProcessGroup&) = delete;
  LocalProcessGroup& operator=(const LocalProcessGroup&) = delete;

  // Fork/execs spec.argv with the launcher's environment plus spec.env, stdin from /dev/null (or
  // a pipe for spec.stdin_held_open), stdout and stderr into new pipes. The first process started
  // leads the group. argv[0] without a '/' is looked up in the child's PATH. Throws dtrain::Error
  // when the launcher cannot create the pipes or fork; when exec fails, the child reports why on
  // its stderr and exits with 127 (not found) or 126 (cannot execute), as a shell would.
  //
  // Callers must not reap (ReapOne) between the first Start and the last: the leader must stay at
  // least a zombie so that later processes can still join its group.
  StartedProcess Start(const ProcessSpec& spec);

  // 0 until the first Start.
  pid_t pgid() const { return pgid_; }

  // kill(-pgid, sig). Returns false when the group has no member left (or none was started).
  bool Signal(int sig);

  // Whether any process of the group (children, grandchildren, zombies) still exists.
  bool HasMembers() const;

  // Reaps one exited process of the group that is a child of the launcher: one it started, or a
  // grandchild it inherited as subreaper. Started processes that moved to a group of their own
  // (setsid) are reaped too. nullopt when none has exited yet.
  std::optional<ExitStatus> ReapOne();

  // Sends sig to started processes that are not reaped yet but left the group: kill(-pgid) does
  // not reach them, and their pids cannot have been reused while they are unreaped.
  void SignalStrays(int sig);

  // Started processes not reaped yet.
  size_t unreaped() const { return unreaped_.size(); }

 private:
  pid_t pgid_ = 0;
  std::vector<pid_t> unreaped_;
};

// The absolute path of the running executable (/proc/self/exe). Throws dtrain::Error.
std::string SelfExecutablePath();

}  // namespace dtrain::launcher

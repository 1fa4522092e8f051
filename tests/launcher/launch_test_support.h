// Running the real `dtrain launch` from a test, with a hang guard and a guard against leaks.
//
// LaunchProcess starts the dtrain binary in a process group of its own with stdout and stderr in
// files. Its destructor SIGKILLs that group and every process that carries the job's test
// variable, so a failing assertion never leaves processes behind. Wait() polls waitpid until a
// deadline, then kills: no test can hang, and no test asserts how long anything took.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dtrain::launcher::testing {

inline std::string DtrainBinary() { return DTRAIN_BINARY_DIR "/src/tools/dtrain"; }

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A fresh directory, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "dtrain-launch-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) std::abort();
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Whether pid names a process that still runs (a zombie has finished running).
inline bool IsRunning(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// Running processes whose environment holds exactly `entry` ("NAME=VALUE"). Every process of a job
// started with `--env NAME:VALUE` has it, grandchildren included.
inline std::vector<pid_t> ProcessesWithEnv(const std::string& entry) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::string env = ReadFile(std::string("/proc/") + e->d_name + "/environ");
    size_t start = 0;
    while (start < env.size()) {
      size_t stop = env.find('\0', start);
      if (stop == std::string::npos) stop = env.size();
      if (env.compare(start, stop - start, entry) == 0) {
        if (IsRunning(static_cast<pid_t>(pid))) found.push_back(static_cast<pid_t>(pid));
        break;
      }
      start = stop + 1;
    }
  }
  ::closedir(proc);
  return found;
}

// Pids written by workers, one or more per line, e.g. by `echo $$ $! >> FILE`.
inline std::vector<pid_t> ReadPids(const std::string& file) {
  std::vector<pid_t> pids;
  std::istringstream in(ReadFile(file));
  for (long p; in >> p;) pids.push_back(static_cast<pid_t>(p));
  return pids;
}

// Polls `done` every 10 ms until it holds or `timeout` passes; returns its last value.
template <typename Pred>
bool PollUntil(Pred done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

struct LaunchResult {
  int exit_code = -1;      // the launcher's exit status as a shell reports it
  bool timed_out = false;  // the hang guard had to kill it
  std::string out;         // its stdout
  std::string err;         // its stderr
};

class LaunchProcess {
 public:
  // Starts `dtrain launch` + args with the test's environment plus `extra_env` ("NAME=VALUE").
  // Each job gets a unique DTRAIN_TEST_JOB variable (see job_env()), so that its processes can be
  // found afterwards wherever they are. A non-empty `shell_setup` (e.g. "ulimit -n 40") runs in
  // /bin/sh first, which then execs the launcher in its place.
  explicit LaunchProcess(std::vector<std::string> args,
                         const std::vector<std::string>& extra_env = {},
                         const std::string& shell_setup = "") {
    static int counter = 0;
    job_value_ = std::to_string(::getpid()) + "-" + std::to_string(++counter);
    std::vector<std::string> argv;
    if (!shell_setup.empty()) argv = {"/bin/sh", "-c", shell_setup + "; exec \"$@\"", "sh"};
    for (std::string a : {DtrainBinary(), std::string("launch"), std::string("--env"),
                          "DTRAIN_TEST_JOB:" + job_value_}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.insert(env.end(), extra_env.begin(), extra_env.end());

    std::vector<char*> argv_ptrs, env_ptrs;
    for (auto& a : argv) argv_ptrs.push_back(a.data());
    argv_ptrs.push_back(nullptr);
    for (auto& e : env) env_ptrs.push_back(e.data());
    env_ptrs.push_back(nullptr);
    const std::string out_path = dir_ / "stdout", err_path = dir_ / "stderr";
    int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int in_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(in_fd, 0);
      ::dup2(out_fd, 1);
      ::dup2(err_fd, 2);
      ::execve(argv_ptrs[0], argv_ptrs.data(), env_ptrs.data());
      ::_exit(126);
    }
    ::setpgid(pid_, pid_);
    ::close(out_fd);
    ::close(err_fd);
    ::close(in_fd);
  }

  ~LaunchProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    // Whatever of the job survived, found by its variable (a bare pid may have been reused).
    for (pid_t p : ProcessesWithEnv(job_env())) ::kill(p, SIGKILL);
  }

  LaunchProcess(const LaunchProcess&) = delete;
  LaunchProcess& operator=(const LaunchProcess&) = delete;

  pid_t pid() const { return pid_; }
  // "DTRAIN_TEST_JOB=<unique>": in the environment of every process of this job.
  std::string job_env() const { return "DTRAIN_TEST_JOB=" + job_value_; }
  const TempDir& dir() const { return dir_; }
  void Signal(int sig) { ::kill(pid_, sig); }

  // Waits for the launcher to exit, SIGKILLing it (and failing the test) after `timeout`.
  LaunchResult Wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    LaunchResult r;
    int status = 0;
    const bool exited = PollUntil(
        [&] {
          if (reaped_) return true;
          if (::waitpid(pid_, &status, WNOHANG) == pid_) reaped_ = true;
          return reaped_;
        },
        timeout);
    if (!exited) {
      r.timed_out = true;
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
      ADD_FAILURE() << "dtrain launch did not exit within " << timeout.count() << " ms";
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = ReadFile(dir_ / "stdout");
    r.err = ReadFile(dir_ / "stderr");
    return r;
  }

 private:
  TempDir dir_;
  std::string job_value_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// Runs `dtrain launch` + args to the end.
inline LaunchResult RunLaunch(const std::vector<std::string>& args,
                              const std::vector<std::string>& extra_env = {}) {
  LaunchProcess p(args, extra_env);
  return p.Wait();
}

}  // namespace dtrain::launcher::testing

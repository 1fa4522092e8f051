// Subprocess: a real child process for integration tests.
//
// The child runs in its own process group with its output (stdout and stderr together) in a file;
// the destructor kills the whole group, so a failing test never leaves processes behind. Waits
// are bounded: Wait returns nullopt at the deadline (a hang is a test failure, not a stuck CI).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::testing {

class Subprocess {
 public:
  Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env,
             const std::string& log_path);
  ~Subprocess();

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  int pid() const { return pid_; }
  // Exit code (128 + signal if killed), or nullopt if still running at the deadline.
  std::optional<int> Wait(int timeout_ms);
  bool Running();
  void Kill(int signal);
  std::string Output() const;

 private:
  int pid_ = -1;
  std::optional<int> exit_code_;
  std::string log_path_;
};

// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

std::string BinaryPath(const std::string& relative);  // under the build directory

}  // namespace dtrain::testing

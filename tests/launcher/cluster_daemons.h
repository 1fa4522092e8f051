// Starting and stopping the daemons of a throwaway one-node cluster (Slurm, Grid Engine) for the
// tests of the cluster backends.
//
// The daemons run in the foreground as children of the test in one process group, with their
// output in a log file, so that they die with the test (PR_SET_PDEATHSIG, see process_group.h)
// and the destructor can stop them by group and pid. Whatever they started (job steps, shepherds,
// tasks) is found afterwards by a variable of their environment and killed too. Every wait has a
// deadline.
#pragma once

#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "launch_test_support.h"
#include "launcher/run/process_group.h"
#include "launcher/run/setup_command.h"

namespace dtrain::launcher::testing {

class ClusterDaemons {
 public:
  // `marker`: "NAME=VALUE" in the environment of the daemons and of everything they start.
  explicit ClusterDaemons(std::string marker) : marker_(std::move(marker)) {}
  ~ClusterDaemons() { Stop(); }
  ClusterDaemons(const ClusterDaemons&) = delete;
  ClusterDaemons& operator=(const ClusterDaemons&) = delete;

  // Starts `argv` with `env` on top of the test's environment, stdout and stderr to `log`.
  void Start(const std::vector<std::string>& argv, std::vector<EnvVar> env,
             const std::string& log) {
    ProcessSpec spec;
    std::string command = "exec";
    for (const std::string& a : argv) command += " '" + a + "'";
    spec.argv = {"/bin/sh", "-c", command + " >> '" + log + "' 2>&1"};
    const size_t eq = marker_.find('=');
    env.emplace_back(marker_.substr(0, eq), marker_.substr(eq + 1));
    spec.env = std::move(env);
    group_.Start(spec);  // its pipes are never written: the output goes to the log
  }

  // Whether a started daemon has exited (then the cluster cannot work).
  bool AnyExited() {
    while (group_.ReapOne()) exited_ = true;
    return exited_;
  }

  // SIGTERM, then SIGKILL after a grace; then everything carrying the marker.
  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    group_.Signal(SIGTERM);
    PollUntil(
        [&] {
          while (group_.ReapOne()) {
          }
          return group_.unreaped() == 0;
        },
        std::chrono::seconds(5));
    group_.Signal(SIGKILL);
    group_.SignalStrays(SIGKILL);
    PollUntil(
        [&] {
          for (pid_t p : ProcessesWithEnv(marker_)) ::kill(p, SIGKILL);
          while (group_.ReapOne()) {
          }
          return group_.unreaped() == 0 && ProcessesWithEnv(marker_).empty();
        },
        std::chrono::seconds(10));
  }

 private:
  std::string marker_;
  LocalProcessGroup group_;
  bool exited_ = false;
  bool stopped_ = false;
};

// Runs a short client command (sinfo, qconf) with `env` ("NAME=VALUE") to its end, and returns its
// output; *ok tells whether it succeeded.
inline std::string RunClient(const std::vector<std::string>& env,
                             const std::vector<std::string>& argv, bool* ok = nullptr,
                             std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::vector<std::string> command = {"env"};
  command.insert(command.end(), env.begin(), env.end());
  command.insert(command.end(), argv.begin(), argv.end());
  const std::vector<SetupResult> r = RunSetupCommands({command}, Duration(timeout.count()));
  if (ok != nullptr) *ok = r[0].succeeded();
  return r[0].output;
}

// The last `n` lines of a log file, for messages.
inline std::string LogTail(const std::string& path, size_t n = 15) {
  std::vector<std::string> lines = SplitLines(ReadFile(path));
  std::string out;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) {
    out += "  " + lines[i] + "\n";
  }
  return out;
}

inline std::string ShortHostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string host(name);
  return host.substr(0, host.find('.'));
}

}  // namespace dtrain::launcher::testing

// Short commands the launcher runs to their end before a job starts (ssh -G, rsync), several at
// once, with their output captured.
//
// Threads: like LocalProcessGroup (it uses one): the calling thread must be the process's only
// thread and must live until the call returns. Blocks until every command ended or the deadline
// passed; then what is left is SIGKILLed (its whole process group) and reported as timed out.
// A launcher killed meanwhile takes the commands with it (PR_SET_PDEATHSIG).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtrain/common/deadline.h"
#include "launcher/run/process_group.h"

namespace dtrain::launcher {

struct SetupResult {
  ExitStatus status;       // valid unless timed_out
  bool timed_out = false;  // killed at the deadline
  std::string output;      // stdout and stderr, interleaved as they were read

  bool succeeded() const { return !timed_out && status.succeeded(); }
  // "exited with code 3: <last line of output>" / "did not finish within 10000 ms".
  std::string Describe(Duration timeout) const;
};

// Runs every argv (stdin /dev/null) until all ended or `timeout` passed. Throws dtrain::Error when
// one cannot be started (fork fails); a command that is not found exits with 127.
std::vector<SetupResult> RunSetupCommands(const std::vector<std::vector<std::string>>& commands,
                                          Duration timeout);

}  // namespace dtrain::launcher

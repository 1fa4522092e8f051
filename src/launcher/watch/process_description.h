// How the supervisors name a process and its end in messages, for a process that runs here and
// for one run on another host through a local client (ProcessSpec::remote_via: "ssh"), whose exit
// code stands for the remote process's.
#pragma once

#include <sys/types.h>

#include <string>

#include "launcher/plan/job_plan.h"
#include "launcher/run/process_group.h"

namespace dtrain::launcher {

// "worker 1 (pid 42)", or "worker 1 on node-b (ssh pid 42)".
std::string DescribeProcess(const ProcessSpec& spec, pid_t pid);

// The process ran through ssh and ssh itself failed (its own exit code 255: it could not connect
// or log in, or the connection was lost), rather than the remote process.
bool SshFailed(const ProcessSpec& spec, const ExitStatus& status);

// A signal, or a shell's 128 + signal code passed on by an ssh client (not ssh's own 255).
bool DiedBySignal(const ProcessSpec& spec, const ExitStatus& status);

// ExitStatus::Describe, plus what an ssh client's code means: "exited with code 137: the remote
// process was killed by signal 9 (SIGKILL)", "exited with code 255 (ssh itself failed: ...)".
std::string DescribeExit(const ProcessSpec& spec, const ExitStatus& status);

}  // namespace dtrain::launcher

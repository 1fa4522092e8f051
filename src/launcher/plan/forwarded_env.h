// Which of the launcher's environment variables go with the tasks it starts on other hosts.
//
// A local job passes its whole environment. On another host the remote side provides PATH, HOME,
// ...; the launcher passes what configures dtrain and the frameworks (DMLC_*, PS_*, DTRAIN_*,
// MXNET_*, HOROVOD_*, OMP_NUM_THREADS, KMP_AFFINITY; as launch.py passed DMLC_INTERFACE and
// OMP_NUM_THREADS), never a per-machine address of this host (DMLC_NODE_HOST, DMLC_NODE_PORT), and
// over ssh never DTRAIN_JOB_SECRET (it would be on a command line; the ssh backend sends it through
// the session's stdin).
// Cluster tools (mpirun, srun, qsub) also get NCCL_*, PATH, LD_LIBRARY_PATH and PYTHONPATH, as
// Horovod's documentation passes them to mpirun.
//
// Threads: reads `environ`; not safe against a concurrent setenv.
#pragma once

#include <string>
#include <vector>

#include "launcher/plan/job_plan.h"

namespace dtrain::launcher {

// How the remote tasks are started, which decides what they need from here.
enum class RemoteStart {
  kSsh,          // through an ssh login (ssh_launcher.cc)
  kClusterTool,  // by mpirun, srun or qsub
};

bool IsForwarded(const std::string& name, RemoteStart how);

// The forwarded variables of the launcher's environment, name and value, in environment order.
std::vector<EnvVar> ForwardedEnvironment(RemoteStart how);

// The forwarded variables' names, in environment order, each once.
std::vector<std::string> ForwardedVariableNames(RemoteStart how);

}  // namespace dtrain::launcher

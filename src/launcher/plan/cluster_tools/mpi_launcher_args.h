// The mpirun command lines of `dtrain launch --launcher mpi`. Pure functions: a test checks every
// word.
//
// One mpirun per role (as dmlc-core's mpi tracker runs one for the servers and one for the
// workers), each a single-program job of K tasks:
//
//   mpirun --tag-output --bind-to none [--allow-run-as-root]
//          (--oversubscribe | --hostfile FILE [--map-by node])
//          -np K -x NAME... /bin/sh -c 'DTRAIN_NODE_RANK=$OMPI_COMM_WORLD_RANK ...' COMMAND
//
// so that a task's MPI rank is its rank in its role, mpirun's slots apply to each role as the
// seeds' hostfile meant them (a host with one slot takes one server and one worker), and with
// -s 0 the workers alone are a plain `mpirun -np N COMMAND`, the Horovod way.
//   - --tag-output: every piece of a task's output comes as "[JOB,RANK]<stdout>:...", which the
//     launcher turns back into "[worker RANK] ..." lines (mpi_output.h).
//   - --bind-to none, as horovodrun passes it: with 2 tasks or fewer Open MPI binds each to one
//     core, where its training, its engine thread and its data loading then take turns (the MNIST
//     example across 2 emulated hosts ran at half this machine's CPU and 0.6x Horovod's mpirun
//     with it; both hosts' ranks were bound to core 0).
//   - --allow-run-as-root only when the launcher runs as root: mpirun refuses root without it.
//   - no hostfile: every task on this machine, as many as asked (--oversubscribe), as the local
//     backend does. With one: our `host[:slots]` lines become OpenMPI's `host slots=N`; servers
//     go round-robin over the hosts (--map-by node, as PlaceOnHosts spreads them), workers fill
//     each host's slots in order (mpirun's default: rank 0 on the first host).
//   - -x NAME: the values travel in mpirun's own environment (not on its command line, where
//     `ps` shows them); -x makes mpirun pass them to tasks on other hosts too.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/plan/cluster_tools/cluster_tool_plan.h"
#include "launcher/plan/hostfile.h"

namespace dtrain::launcher {

struct MpirunRequest {
  std::string mpirun = "mpirun";
  RoleTasks tasks;
  std::optional<std::string> hostfile;  // an OpenMPI hostfile; none: all here, oversubscribed
  bool as_root = false;
  // Names of launcher variables to pass on besides the tasks' own (ForwardedVariableNames(),
  // forwarded_env.h).
  std::vector<std::string> forwarded;
};

std::vector<std::string> MpirunCommand(const MpirunRequest& request);

// Our hostfile as OpenMPI's: "host slots=N" a line, hosts listed twice merged (slots added).
std::string OpenMpiHostfile(const std::vector<HostEntry>& hosts);

// What a task writes as its last line on stderr when it fails, before its exit status: mpirun
// names the task that failed first only sometimes (its summary can be missing when it aborts the
// others), so each task's wrapper says it itself. mpi_output.h takes the line out again.
inline constexpr char kMpiExitMarker[] = "dtrain-task-exit-status: ";

// {"/bin/sh", "-c", SCRIPT, "dtrain-task", argv...}: SCRIPT sets DTRAIN_NODE_RANK from
// OMPI_COMM_WORLD_RANK, runs argv (as a child, so that it can report), and exits with its status,
// after writing kMpiExitMarker and the status when that is not 0. mpirun signals a task's whole
// process group, so the shell in between does not change how a task is stopped.
std::vector<std::string> MpiTaskCommand(const std::vector<std::string>& argv);

}  // namespace dtrain::launcher

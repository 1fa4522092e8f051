// The srun command lines of `dtrain launch --launcher slurm`. Pure functions: a test checks every
// word.
//
// Inside an allocation, one job step per role (as the mpi backend runs one mpirun per role), each
// K tasks of one command:
//
//   SLURM_HOSTFILE=FILE srun --ntasks=K --distribution=arbitrary --overlap --overcommit
//        --kill-on-bad-exit=1 --label --export=ALL --job-name=dtrain-<role>s
//        /bin/sh -c 'DTRAIN_NODE_RANK=${SLURM_PROCID:?}; ...' COMMAND
//
//   - the task's SLURM_PROCID is its rank in its role;
//   - --distribution=arbitrary with SLURM_HOSTFILE (one node a line, task i on line i) places each
//     task where PlaceOnHosts put it: servers and workers each cycle through the allocation's
//     nodes, one of each per node when there are as many nodes as workers, as the seeds place them;
//   - --overlap and --overcommit: the two steps share the allocation's CPUs, and a node can take a
//     server and a worker even when it was allocated one CPU (a server mostly waits on the
//     network);
//   - --kill-on-bad-exit=1: a task that fails ends its whole step at once;
//   - --label: each line of a task comes as "RANK: ...", which the launcher turns back into
//     "[worker RANK] ..." (slurm_output.h);
//   - --export=ALL: the tasks get srun's environment, which holds the job's variables (a batch
//     script's SLURM_EXPORT_ENV=NONE would otherwise drop them).
#pragma once

#include <string>
#include <vector>

#include "launcher/plan/cluster_tools/cluster_tool_plan.h"

namespace dtrain::launcher {

std::vector<std::string> SrunCommand(const std::string& srun, const RoleTasks& tasks);

// SLURM_HOSTFILE for one step: the node of task i on line i.
std::string SlurmHostfile(const std::vector<std::string>& task_hosts);

// `scontrol show hostnames NODELIST`: expands "node[1-3],gpu7" into one name a line.
std::vector<std::string> ExpandNodelistCommand(const std::string& scontrol,
                                               const std::string& nodelist);

inline constexpr char kSlurmRankExpression[] = "${SLURM_PROCID:?}";

}  // namespace dtrain::launcher

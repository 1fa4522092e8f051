// The launcher backends: each runs a whole job described by LaunchOptions and returns the
// launcher's exit code. `dtrain launch` picks one by --launcher (launch_command.cc).
//
//   local  every process on this machine (local_job.h)
//   ssh    scheduler here, servers and workers on the hostfile's hosts through ssh
//   mpi    servers and workers through OpenMPI's mpirun (scheduler here)
//   slurm  inside an allocation, through srun
//   sge    submitted with qsub, waited for
//
// A usage problem found by a backend (no hostfile, not inside an allocation) is a UsageError
// (exit 2); a failure while running is reported on stderr and returned as the exit code.
#pragma once

#include "launcher/plan/launch_options.h"

namespace dtrain::launcher {

int RunLocalJob(const LaunchOptions& options);
int RunSshJob(const LaunchOptions& options);
int RunMpiJob(const LaunchOptions& options);
int RunSlurmJob(const LaunchOptions& options);
int RunSgeJob(const LaunchOptions& options);
// --host-discovery-script, with --launcher local or ssh (elastic_launcher.cc).
int RunElasticJob(const LaunchOptions& options);

// DTRAIN_CHECKPOINT_DIR is set and not empty (by the user, or by `dtrain launch --max-restarts`):
// the servers write checkpoints, so a lost server can be replaced like a lost worker.
bool ServerCheckpointsOn();

}  // namespace dtrain::launcher

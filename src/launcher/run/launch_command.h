// `dtrain launch`: starts a whole job with one command.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "common/config/env_reader.h"
#include "launcher/plan/launch_options.h"

namespace dtrain::launcher {

// Adds the `launch` subcommand to `app`; when it is chosen, the callback runs the job and stores
// the job's exit code in *exit_code.
void AddLaunchCommand(CLI::App& app, int* exit_code);

// What `dtrain launch` sets in its own environment before it starts anything, so that every
// process of the job has it: local children inherit it, mpirun (-x), srun (--export=ALL) and qsub
// (-V) pass it on, and the ssh backend forwards it (the secret through each remote guard's stdin).
// Decided from the options and the launcher's environment as the configuration reader reads it
// (common/config/env_reader.h): NAME= counts as unset, as it does in every process of the job.
struct LaunchVariables {
  // DTRAIN_JOB_SECRET unset: a fresh one for this job. A secret the user set is kept.
  bool new_job_secret = false;
  // --max-restarts and DTRAIN_RESTART_WAIT_MS unset: "60000", so that the scheduler and the servers
  // wait for a lost member's replacement instead of failing the job.
  std::optional<std::string> restart_wait_ms;
  // --max-restarts with servers and DTRAIN_CHECKPOINT_DIR unset: a fresh folder for this job's
  // server checkpoints, so that a lost server can be replaced too.
  bool new_checkpoint_dir = false;
};

// Throws ConfigError when DTRAIN_JOB_SECRET is set but empty or too short (JobSecretFromVariable),
// before anything starts.
LaunchVariables PlanLaunchVariables(const LaunchOptions& options, const EnvReader& env);

}  // namespace dtrain::launcher

#include "launcher/run/launch_command.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "auth/job_auth.h"
#include "common/config/config.h"
#include "dtrain/common/error.h"
#include "launcher/plan/job_plan.h"
#include "launcher/plan/launch_options.h"
#include "launcher/plan/local_address.h"
#include "launcher/run/backends.h"
#include "launcher/run/process_group.h"
#include "launcher/status/report_setup.h"
#include "launcher/watch/local_job.h"

namespace dtrain::launcher {

bool ServerCheckpointsOn() {
  return EnvReader(ProcessEnvironment()).Text("DTRAIN_CHECKPOINT_DIR").has_value();
}

LaunchVariables PlanLaunchVariables(const LaunchOptions& options, const EnvReader& env) {
  LaunchVariables v;
  // "" only when unset: a secret set but empty (or too short) is refused here, as by every process.
  v.new_job_secret = JobSecretFromEnvironment(env).empty();
  const bool restarts = options.max_restarts > 0;
  if (restarts && !env.Text("DTRAIN_RESTART_WAIT_MS")) v.restart_wait_ms = "60000";
  v.new_checkpoint_dir = restarts && options.num_servers > 0 && !env.Text("DTRAIN_CHECKPOINT_DIR");
  return v;
}

namespace {

constexpr int kUsageExitCode = 2;
constexpr int kLauncherFailureExitCode = 1;

int ReportUsageError(const UsageError& e) {
  std::fprintf(stderr, "dtrain launch: error: %s\nRun `dtrain launch --help` for the options.\n",
               e.what());
  return kUsageExitCode;
}

std::string Count(int n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace

int RunLocalJob(const LaunchOptions& options) {
  if (options.sync_dst_dir) throw UsageError("--sync-dst-dir needs --launcher ssh");
  if (!options.ssh_options.empty()) throw UsageError("--ssh-opts needs --launcher ssh");
  if (options.hostfile) {
    throw UsageError(
        "-H/--hostfile does not apply to --launcher local, which runs every process on this "
        "machine: to use the hosts of " +
        *options.hostfile + ", add --launcher ssh (or mpi)");
  }
  if (options.host_discovery_script) return RunElasticJob(options);
  const uint16_t port = PickFreeLoopbackPort();
  JobPlan plan = BuildJobPlan(options, PlaceLocally(options.num_servers, options.num_workers),
                              SelfExecutablePath(), port);
  if (plan.num_servers == 0) {
    std::fprintf(stderr,
                 "dtrain launch: starting %s on this machine (allreduce job: no scheduler or "
                 "servers; rendezvous at %s:%u)\n",
                 Count(plan.num_workers, "worker").c_str(), plan.scheduler_host.c_str(),
                 static_cast<unsigned>(plan.scheduler_port));
  } else {
    std::fprintf(
        stderr,
        "dtrain launch: starting 1 scheduler, %s, %s on this machine (scheduler at %s:%u)\n",
        Count(plan.num_servers, "server").c_str(), Count(plan.num_workers, "worker").c_str(),
        plan.scheduler_host.c_str(), static_cast<unsigned>(plan.scheduler_port));
  }
  SupervisorOptions supervision;
  supervision.kill_grace = options.kill_grace;
  supervision.service_grace = options.service_grace;
  supervision.max_restarts = options.max_restarts;
  supervision.replace_servers = ServerCheckpointsOn();
  supervision.output_dir = options.output_dir;
  SetUpReports(options, &plan, &supervision);
  return SuperviseLocalJob(plan, supervision);
}

namespace {

// A fresh folder for this job's server checkpoints (each server makes its own under it, on its
// host), set as DTRAIN_CHECKPOINT_DIR; removed at the end by the local backend.
std::string MakeCheckpointDir() {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("dtrain-checkpoints-" + auth::NewNonce().substr(0, 12)))
                              .string();
  ::setenv("DTRAIN_CHECKPOINT_DIR", dir.c_str(), 1);
  return dir;
}

int RunBackend(const LaunchOptions& options) {
  // Every job gets a fresh secret unless the user set one (e.g. to admit a process started by
  // hand); set in our environment, these reach every process (LaunchVariables).
  const LaunchVariables set = PlanLaunchVariables(options, EnvReader(ProcessEnvironment()));
  if (set.new_job_secret) ::setenv("DTRAIN_JOB_SECRET", auth::NewNonce().c_str(), 1);
  if (set.restart_wait_ms) ::setenv("DTRAIN_RESTART_WAIT_MS", set.restart_wait_ms->c_str(), 1);
  const std::string made_checkpoint_dir = set.new_checkpoint_dir ? MakeCheckpointDir() : "";
  switch (options.launcher) {
    case LauncherKind::kLocal: {
      const int code = RunLocalJob(options);
      std::error_code ec;
      if (!made_checkpoint_dir.empty()) std::filesystem::remove_all(made_checkpoint_dir, ec);
      return code;
    }
    case LauncherKind::kSsh:
      return RunSshJob(options);
    case LauncherKind::kMpi:
      return RunMpiJob(options);
    case LauncherKind::kSlurm:
      return RunSlurmJob(options);
    case LauncherKind::kSge:
      return RunSgeJob(options);
    case LauncherKind::kRay:  // elastic only (launch_options.cc)
    case LauncherKind::kSpark:
      return RunElasticJob(options);
  }
  return kLauncherFailureExitCode;
}

// `args`: what followed `launch` on the command line, in order.
int RunLaunch(const std::vector<std::string>& args) {
  LaunchOptions options;
  try {
    std::optional<LaunchOptions> parsed = ParseLaunchArgs(args);
    if (!parsed) return 0;  // --help
    options = std::move(*parsed);
  } catch (const UsageError& e) {
    return ReportUsageError(e);
  }
  try {
    return RunBackend(options);
  } catch (const UsageError& e) {
    return ReportUsageError(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain launch: error: %s\n", e.what());
    return kLauncherFailureExitCode;
  }
}

}  // namespace

void AddLaunchCommand(CLI::App& app, int* exit_code) {
  CLI::App* launch = app.add_subcommand(
      "launch",
      "start a job: 1 scheduler, S servers, N workers running COMMAND on this machine "
      "(dtrain launch --help)");
  // CLI11 only collects the raw arguments here; ParseLaunchArgs parses them, so that every usage
  // error becomes exit code 2 with our message, and flags after the user command stay its own.
  //  - prefix_command: from the first argument that is not ours on, everything is left alone;
  //  - no help flag: --help reaches ParseLaunchArgs, which knows the flags;
  //  - a positional that never accepts anything (its check always fails): without one, CLI11 hands
  //    "--" and what follows back to the parent command.
  launch->prefix_command();
  launch->set_help_flag();
  launch->validate_positionals();
  launch
      ->add_option_function<std::vector<std::string>>(
          "args", [](const std::vector<std::string>&) {}, "")
      ->check(CLI::Validator([](std::string&) { return std::string("raw"); }, "", ""))
      ->group("");
  launch->callback([launch, exit_code] { *exit_code = RunLaunch(launch->remaining()); });
}

}  // namespace dtrain::launcher

#include "launcher/launch_command.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "launcher/backends.h"
#include "launcher/job_plan.h"
#include "launcher/launch_options.h"
#include "launcher/process_group.h"
#include "launcher/supervisor.h"

namespace dtrain::launcher {
namespace {

constexpr int kUsageExitCode = 2;
constexpr int kLauncherFailureExitCode = 1;

// A TCP port on 127.0.0.1 that is free right now: the kernel's choice for port 0. The scheduler
// binds it a moment later; another program could take it in between, which the scheduler then
// reports, as ps-lite users know it.
uint16_t PickFreeLoopbackPort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw Error(std::string("cannot create a socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw Error(std::string("cannot find a free port on 127.0.0.1: ") + std::strerror(errno));
  }
  return ntohs(addr.sin_port);
}

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
  const uint16_t port = PickFreeLoopbackPort();
  const JobPlan plan = BuildJobPlan(options, PlaceLocally(options.num_servers, options.num_workers),
                                    SelfExecutablePath(), port);
  std::fprintf(stderr,
               "dtrain launch: starting 1 scheduler, %s, %s on this machine (scheduler at %s:%u)\n",
               Count(plan.num_servers, "server").c_str(), Count(plan.num_workers, "worker").c_str(),
               plan.scheduler_host.c_str(), static_cast<unsigned>(plan.scheduler_port));
  SupervisorOptions supervision;
  supervision.kill_grace = options.kill_grace;
  supervision.service_grace = options.service_grace;
  supervision.output_dir = options.output_dir;
  return SuperviseLocalJob(plan, supervision);
}

namespace {

int RunBackend(const LaunchOptions& options) {
  switch (options.launcher) {
    case LauncherKind::kLocal:
      return RunLocalJob(options);
    case LauncherKind::kSsh:
      return RunSshJob(options);
    case LauncherKind::kMpi:
      return RunMpiJob(options);
    case LauncherKind::kSlurm:
      return RunSlurmJob(options);
    case LauncherKind::kSge:
      return RunSgeJob(options);
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

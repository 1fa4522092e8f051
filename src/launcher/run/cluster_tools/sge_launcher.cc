// `dtrain launch --launcher sge`: servers and workers as Grid Engine array jobs, the scheduler
// here.
//
// Design: the scheduler runs where `dtrain launch` runs (a submit host), as a local supervised
// process. Each role is one array job submitted with `qsub -sync y`, which also waits for it and
// reports each task that fails (sge_launcher_args.h, sge_output.h). Grid Engine writes the tasks'
// output to files, never through qsub: they go to a fresh directory under the current directory
// (which the nodes share with this host, as -cwd needs), the launcher streams them into its
// output as they grow, with the usual "[worker 1] " prefixes, and removes the directory at the
// end. A failing task does not stop the others in Grid Engine: the launcher does, with qdel.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "common/config/config.h"
#include "common/net_address.h"
#include "dtrain/common/error.h"
#include "launcher/plan/cluster_tools/cluster_tool_plan.h"
#include "launcher/plan/cluster_tools/sge_launcher_args.h"
#include "launcher/plan/local_address.h"
#include "launcher/run/backends.h"
#include "launcher/run/cluster_tools/sge_output.h"
#include "launcher/run/process_group.h"
#include "launcher/run/setup_command.h"
#include "launcher/status/report_setup.h"
#include "launcher/watch/cluster_tool_job.h"

namespace dtrain::launcher {
namespace {

constexpr Duration kQconfTimeout{30000};

// The execution hosts (`qconf -sel`); empty when they cannot be listed.
std::vector<std::string> ExecutionHosts() {
  const std::optional<std::string> qconf = FindProgram("qconf");
  if (!qconf) return {};
  const std::vector<SetupResult> r = RunSetupCommands({{*qconf, "-sel"}}, kQconfTimeout);
  if (!r[0].succeeded()) return {};
  return ParseHostnames(r[0].output);
}

}  // namespace

int RunSgeJob(const LaunchOptions& options) {
  RejectSshOnlyFlags(options);
  if (options.hostfile) {
    throw UsageError(
        "-H/--hostfile does not apply to --launcher sge: Grid Engine chooses the hosts");
  }
  const std::string hint =
      "Grid Engine's client commands: apt install gridengine-client, then source your cell's "
      "settings.sh";
  const std::string qsub = RequireProgram("qsub", LauncherKind::kSge, hint);
  const std::string qdel = RequireProgram("qdel", LauncherKind::kSge, hint);

  // The tasks may run on any execution host: the scheduler listens on 127.0.0.1 only when every
  // one is this machine, else on the address toward them (or --interface's).
  const std::vector<std::string> exec_hosts = ExecutionHosts();
  bool all_here = !exec_hosts.empty();
  for (const std::string& h : exec_hosts) all_here = all_here && IsThisMachine(h);
  if (options.num_servers == 0 && !all_here) {
    // Worker 0's host is the rendezvous, and Grid Engine only picks it when the job runs.
    throw UsageError(
        "--launcher sge cannot start an allreduce job (-s 0) whose workers may run on other "
        "hosts: the rendezvous is worker 0's address, which only Grid Engine knows when it runs "
        "the task (use --launcher mpi or ssh for -s 0)");
  }
  Placement placement;
  if (exec_hosts.empty()) {
    Config here;  // no DMLC_NODE_HOST, no loopback scheduler: this host's outward address
    if (options.interface) here.interface = *options.interface;
    placement = PlaceLocally(options.num_servers, options.num_workers);
    placement.scheduler_host = AnnounceAddress(here);
  } else {
    std::vector<HostEntry> hosts;
    for (const std::string& h : exec_hosts) hosts.push_back({h, 1});
    placement = PlaceOnClusterHosts(hosts, options, SchedulerAddressFor(exec_hosts, options));
  }
  JobPlan plan = BuildJobPlan(options, placement, SelfExecutablePath(), PickFreePort());
  SupervisorOptions supervision = SupervisionFor(options);
  SetUpReports(options, &plan, &supervision);
  TaskPlan tasks = ToTaskPlan(plan, options);

  // Under the current directory, which the execution hosts share with this one.
  std::error_code ec;
  const std::filesystem::path here = std::filesystem::current_path(ec);
  if (ec) throw Error("cannot read the current directory: " + ec.message());
  ScratchDirectory dir(here.string(), ".dtrain-sge-");
  FrontEndJob job;
  job.scheduler = std::move(tasks.scheduler);
  std::vector<std::unique_ptr<ScratchFile>> scripts;
  for (RoleTasks& role : tasks.roles) {
    scripts.push_back(std::make_unique<ScratchFile>(
        dir.path(), "job-" + RolePlural(role.role) + "-", SgeJobScript(role)));
    FrontEnd fe;
    fe.tool = "qsub";
    fe.role = role.role;
    fe.num_tasks = role.count;
    fe.argv = QsubCommand(qsub, role, dir.path(), scripts.back()->path());
    fe.parser = std::make_unique<QsubOutputParser>(qdel);
    for (int t = 0; t < role.count; ++t) {
      for (bool err : {false, true}) {
        fe.task_files.push_back({t, err, SgeTaskOutputPath(dir.path(), role.role, t, err)});
      }
    }
    job.front_ends.push_back(std::move(fe));
  }
  std::fprintf(
      stderr, "%s\n",
      StartLine(plan, "as Grid Engine array jobs (qsub -sync y; output in " + dir.path() + ")")
          .c_str());
  return SuperviseFrontEndJob(std::move(job), supervision);
}

}  // namespace dtrain::launcher

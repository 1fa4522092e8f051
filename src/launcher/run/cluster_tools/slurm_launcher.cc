// `dtrain launch --launcher slurm`: inside a Slurm allocation, servers and workers as job steps
// started with srun, the scheduler here.
//
// Design: `dtrain launch` runs inside the allocation (salloc or an sbatch script), so it needs no
// credentials of its own and the job ends with the allocation. The scheduler runs here, as a
// local supervised process (on the batch host for sbatch, where salloc was typed for salloc); the
// servers and the workers are one step each (slurm_launcher_args.h), placed over the allocation's
// nodes (SLURM_JOB_NODELIST, expanded by `scontrol show hostnames`) as the seeds place them.
// srun's --kill-on-bad-exit ends a step whose task failed, its report names the task, and the
// launcher stops the other step and the scheduler (cluster_tool_job.h).
#include <cstdio>
#include <cstdlib>

#include "launcher/plan/cluster_tools/cluster_tool_plan.h"
#include "launcher/plan/cluster_tools/slurm_launcher_args.h"
#include "launcher/plan/local_address.h"
#include "launcher/run/backends.h"
#include "launcher/run/cluster_tools/slurm_output.h"
#include "launcher/run/process_group.h"
#include "launcher/run/setup_command.h"
#include "launcher/status/report_setup.h"
#include "launcher/watch/cluster_tool_job.h"

namespace dtrain::launcher {
namespace {

constexpr Duration kScontrolTimeout{30000};

std::string AllocationVariable(const char* name) {
  // Raw read: SLURM_* describe the allocation Slurm started us in; not dtrain's variables.
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::vector<std::string> AllocationNodes(const std::string& scontrol, const std::string& nodelist) {
  const std::vector<SetupResult> r =
      RunSetupCommands({ExpandNodelistCommand(scontrol, nodelist)}, kScontrolTimeout);
  std::vector<std::string> hosts = ParseHostnames(r[0].output);
  if (!r[0].succeeded() || hosts.empty()) {
    throw Error("cannot list the allocation's nodes: `scontrol show hostnames " + nodelist + "` " +
                r[0].Describe(kScontrolTimeout));
  }
  return hosts;
}

}  // namespace

int RunSlurmJob(const LaunchOptions& options) {
  RejectSshOnlyFlags(options);
  if (options.hostfile) {
    throw UsageError(
        "-H/--hostfile does not apply to --launcher slurm: the job runs on the nodes of its "
        "Slurm allocation (SLURM_JOB_NODELIST)");
  }
  const std::string job_id = AllocationVariable("SLURM_JOB_ID");
  std::string nodelist = AllocationVariable("SLURM_JOB_NODELIST");
  if (nodelist.empty()) nodelist = AllocationVariable("SLURM_NODELIST");
  if (job_id.empty() || nodelist.empty()) {
    throw UsageError(
        "--launcher slurm runs inside a Slurm allocation, and there is none here (SLURM_JOB_ID "
        "is not set): get one first, e.g. `salloc -N 2 dtrain launch --launcher slurm -n 2 ...`, "
        "or put the `dtrain launch --launcher slurm ...` line in a script for `sbatch -N 2`");
  }
  const std::string hint = "the Slurm client commands: apt install slurm-client";
  const std::string srun = RequireProgram("srun", LauncherKind::kSlurm, hint);
  const std::string scontrol = RequireProgram("scontrol", LauncherKind::kSlurm, hint);

  const std::vector<std::string> nodes = AllocationNodes(scontrol, nodelist);
  std::vector<HostEntry> hosts;
  for (const std::string& n : nodes) hosts.push_back({n, 1});
  const Placement placement =
      PlaceOnClusterHosts(hosts, options, SchedulerAddressFor(nodes, options));
  JobPlan plan = BuildJobPlan(options, placement, SelfExecutablePath(), PickFreePort());
  SupervisorOptions supervision = SupervisionFor(options);
  SetUpReports(options, &plan, &supervision);
  TaskPlan tasks = ToTaskPlan(plan, options);

  FrontEndJob job;
  job.scheduler = std::move(tasks.scheduler);
  std::vector<std::unique_ptr<ScratchFile>> hostfiles;  // read by srun: kept until the job ends
  for (RoleTasks& role : tasks.roles) {
    const auto& task_hosts =
        role.role == Role::kServer ? placement.server_hosts : placement.worker_hosts;
    hostfiles.push_back(std::make_unique<ScratchFile>(TempDirectory(), "dtrain-slurm-hosts-",
                                                      SlurmHostfile(task_hosts)));
    FrontEnd fe;
    fe.tool = "srun";
    fe.role = role.role;
    fe.num_tasks = role.count;
    fe.argv = SrunCommand(srun, role);
    fe.env = std::move(role.env);  // srun passes its environment to the tasks (--export=ALL)
    fe.env.emplace_back("SLURM_HOSTFILE", hostfiles.back()->path());
    fe.parser = std::make_unique<SrunOutputParser>();
    job.front_ends.push_back(std::move(fe));
  }
  std::fprintf(
      stderr, "%s\n",
      StartLine(plan, "through srun in Slurm job " + job_id + " (" + std::to_string(nodes.size()) +
                          (nodes.size() == 1 ? " node)" : " nodes)"))
          .c_str());
  return SuperviseFrontEndJob(std::move(job), supervision);
}

}  // namespace dtrain::launcher

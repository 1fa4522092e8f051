// `dtrain launch --launcher mpi`: servers and workers through Open MPI's mpirun, the scheduler
// here.
//
// Design: the scheduler runs where `dtrain launch` runs, as a local supervised process (it is one
// small process that every node must reach; mpirun would only add a hop). The servers and the
// workers each go through one mpirun (mpi_launcher_args.h says why one per role), which places
// them by the hostfile's slots, passes the job's variables (-x) and tags their output; the
// launcher turns the tags back into "[worker 1] ..." lines (mpi_output.h) and names the task that
// mpirun reports as failed. mpirun aborts the rest of its tasks when one fails; the launcher then
// stops the other mpirun and the scheduler (cluster_tool_job.h). With -s 0 there is neither
// scheduler nor servers: one plain `mpirun -np N COMMAND`, as Horovod jobs start, where collectives
// take their layout from MPI itself.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "dtrain/common/error.h"
#include "launcher/plan/cluster_tools/cluster_tool_plan.h"
#include "launcher/plan/cluster_tools/mpi_launcher_args.h"
#include "launcher/plan/forwarded_env.h"
#include "launcher/plan/hostfile.h"
#include "launcher/plan/local_address.h"
#include "launcher/run/backends.h"
#include "launcher/run/cluster_tools/mpi_output.h"
#include "launcher/run/process_group.h"
#include "launcher/run/setup_command.h"
#include "launcher/status/report_setup.h"
#include "launcher/watch/cluster_tool_job.h"

namespace dtrain::launcher {
namespace {

constexpr Duration kVersionTimeout{10000};

// Our flags (--tag-output, --oversubscribe, -x) are Open MPI's; MPICH's mpirun would misread them.
void RequireOpenMpi(const std::string& mpirun) {
  const std::vector<SetupResult> r = RunSetupCommands({{mpirun, "--version"}}, kVersionTimeout);
  if (r[0].succeeded() && r[0].output.find("Open MPI") != std::string::npos) return;
  const std::string what = r[0].succeeded()
                               ? "says: " + r[0].output.substr(0, r[0].output.find('\n'))
                               : r[0].Describe(kVersionTimeout);
  throw UsageError("--launcher mpi needs Open MPI's mpirun; `" + mpirun + " --version` " + what);
}

}  // namespace

int RunMpiJob(const LaunchOptions& options) {
  RejectSshOnlyFlags(options);
  const std::string mpirun =
      RequireProgram("mpirun", LauncherKind::kMpi, "install Open MPI: apt install openmpi-bin");
  RequireOpenMpi(mpirun);

  std::optional<ScratchFile> mpi_hostfile;
  // A job on this machine keeps Open MPI's session directory in a folder of its own. Under the
  // shared default (/tmp/ompi.HOST.UID) a job that ends removes that folder while another starting
  // here is creating its own in it, and that start fails ("A call to mkdir was unable to create
  // the desired directory": seen with two jobs at once in ctest). The job's two mpiruns (servers,
  // workers) each get a folder of it: in one, both made the same session directory at once and
  // one failed the same way ("File exists", seen once in a fresh-clone CI run). Jobs over a
  // hostfile keep the default, which each host creates for itself.
  std::optional<ScratchDirectory> session;
  Placement placement;
  std::string where = "through mpirun on this machine";
  if (options.hostfile) {
    const std::vector<HostEntry> hosts = ReadHostfile(*options.hostfile);
    std::vector<std::string> names;
    for (const HostEntry& h : hosts) names.push_back(h.host);
    placement = PlaceOnClusterHosts(hosts, options, SchedulerAddressFor(names, options));
    mpi_hostfile.emplace(TempDirectory(), "dtrain-mpi-hosts-", OpenMpiHostfile(hosts));
    where = "through mpirun on the hosts of " + *options.hostfile;
  } else {
    placement = PlaceLocally(options.num_servers, options.num_workers);
    session.emplace(TempDirectory(), "dtrain-mpi-");
  }
  JobPlan plan = BuildJobPlan(options, placement, SelfExecutablePath(), PickFreePort());
  SupervisorOptions supervision = SupervisionFor(options);
  SetUpReports(options, &plan, &supervision);
  TaskPlan tasks = ToTaskPlan(plan, options);

  FrontEndJob job;
  job.scheduler = std::move(tasks.scheduler);
  const std::vector<std::string> forwarded = ForwardedVariableNames(RemoteStart::kClusterTool);
  for (RoleTasks& role : tasks.roles) {
    MpirunRequest request;
    request.mpirun = mpirun;
    request.tasks = role;
    if (mpi_hostfile) request.hostfile = mpi_hostfile->path();
    request.as_root = ::geteuid() == 0;
    request.forwarded = forwarded;
    FrontEnd fe;
    fe.tool = "mpirun";
    fe.role = role.role;
    fe.num_tasks = role.count;
    fe.argv = MpirunCommand(request);
    fe.env = std::move(role.env);  // -x NAME takes the value from mpirun's environment
    if (session) {
      const std::string tmpdir = session->path() + "/" + RolePlural(role.role);
      std::error_code error;
      if (!std::filesystem::create_directory(tmpdir, error)) {
        throw Error("cannot create " + tmpdir + " for mpirun's session: " + error.message());
      }
      fe.env.emplace_back("OMPI_MCA_orte_tmpdir_base", tmpdir);
    }
    fe.parser = std::make_unique<MpiOutputParser>();
    job.front_ends.push_back(std::move(fe));
  }
  std::fprintf(stderr, "%s\n", StartLine(plan, where).c_str());
  return SuperviseFrontEndJob(std::move(job), supervision);
}

}  // namespace dtrain::launcher

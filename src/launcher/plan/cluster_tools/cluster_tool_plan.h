// What the mpi, slurm and sge backends share before a job starts: the job's plan as one command
// per role, where the scheduler listens, and a few facts about this host.
//
// A backend builds the plan as every backend does (BuildJobPlan), so a task sees the same
// variables as under the local or ssh backend. The cluster's tool then starts each role as K
// tasks of one command, and a task learns its rank from the tool only when it starts
// (OMPI_COMM_WORLD_RANK, SLURM_PROCID, SGE_TASK_ID - 1). So RoleTasks keeps what all processes of
// a role share, and CommandWithRankFrom wraps their command in one line of sh that sets
// DTRAIN_NODE_RANK from the tool's variable (nothing to install on the nodes; the mpi backend's
// wrapper also reports a failure, see mpi_launcher_args.h; the sge backend's job script sets it).
//
// Where a task runs is the tool's choice, so the launcher's DMLC_NODE_HOST is left out: a node
// without it announces 127.0.0.1 when the scheduler is on loopback, DMLC_INTERFACE's address with
// --interface, else its first non-loopback address (common/net_address.h), as ps-lite nodes do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/plan/hostfile.h"
#include "launcher/plan/job_plan.h"
#include "launcher/plan/launch_options.h"
#include "launcher/watch/local_job.h"

namespace dtrain::launcher {

// The processes of one role, as one command started `count` times.
struct RoleTasks {
  Role role = Role::kWorker;
  int count = 0;
  std::vector<std::string> argv;
  std::vector<EnvVar>
      env;  // the plan's, without DTRAIN_NODE_RANK and the launcher's DMLC_NODE_HOST
};

struct TaskPlan {
  std::optional<ProcessSpec> scheduler;  // runs here; none in an allreduce job (-s 0)
  std::vector<RoleTasks> roles;          // the servers (if any), then the workers
};

// "servers", "workers".
std::string RolePlural(Role role);

TaskPlan ToTaskPlan(const JobPlan& plan, const LaunchOptions& options);

// {"/bin/sh", "-c", "DTRAIN_NODE_RANK=<rank_expression>; export ...; exec \"$@\"", "dtrain-task",
// argv...}. `rank_expression` is sh, e.g. "${OMPI_COMM_WORLD_RANK:?}" (the :? makes a task
// started outside the tool fail with a message instead of running with no rank).
std::vector<std::string> CommandWithRankFrom(const std::string& rank_expression,
                                             const std::vector<std::string>& argv);

// The scheduler's address as tasks on `hosts` reach it: 127.0.0.1 when every host is this
// machine; else --interface's address, or this host's address on the route to the first other
// host. Throws UsageError when that cannot be found.
std::string SchedulerAddressFor(const std::vector<std::string>& hosts,
                                const LaunchOptions& options);

// PlaceOnHosts, with every host that is this machine reached at `scheduler_address` (in an
// allreduce job, worker 0's host is the rendezvous, and "localhost" would be wrong elsewhere).
Placement PlaceOnClusterHosts(const std::vector<HostEntry>& hosts, const LaunchOptions& options,
                              const std::string& scheduler_address);

// Host names in a tool's output, one or more a line (`scontrol show hostnames`, `qconf -sel`).
std::vector<std::string> ParseHostnames(const std::string& output);

// The path under which the launcher's PATH finds `program`; nullopt when it does not.
std::optional<std::string> FindProgram(const std::string& program);

// A file created with `contents` (mode 0600) in `dir`, removed when this goes away.
class ScratchFile {
 public:
  // `name_prefix` starts the file's name ("dtrain-hosts-"). Throws dtrain::Error.
  ScratchFile(const std::string& dir, const std::string& name_prefix, const std::string& contents);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A directory created (mode 0700) in `parent`, removed with its contents when this goes away.
class ScratchDirectory {
 public:
  // `name_prefix` starts the directory's name (".dtrain-sge-"). Throws dtrain::Error.
  ScratchDirectory(const std::string& parent, const std::string& name_prefix);
  ~ScratchDirectory();
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The launcher's temporary directory: $TMPDIR, else /tmp.
std::string TempDirectory();

// FindProgram, or a UsageError: "--launcher mpi needs mpirun, which is not in PATH (<hint>)".
std::string RequireProgram(const std::string& program, LauncherKind launcher,
                           const std::string& hint);

// Refuses flags that only the ssh backend uses.
void RejectSshOnlyFlags(const LaunchOptions& options);

// The job's first line on stderr: "dtrain launch: starting 1 scheduler here (at H:P), 2 servers
// and 2 workers <where>", or for an allreduce job "... starting 4 workers <where> (allreduce job:
// no scheduler or servers; rendezvous at H:P)".
std::string StartLine(const JobPlan& plan, const std::string& where);

// The supervision settings that the flags choose.
SupervisorOptions SupervisionFor(const LaunchOptions& options);

}  // namespace dtrain::launcher

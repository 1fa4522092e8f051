// The flags of `dtrain launch`, parsed and validated into one typed value.
//
// Parsing is separate from running so that every usage mistake is found before a single process
// starts, and so that the messages can be tested without starting any. A mistake is reported as a
// UsageError whose message names the flag and the bad value; `dtrain launch` turns it into exit
// code 2. Pure functions of their arguments (and, for `--env NAME`, of the launcher's environment);
// any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/common/deadline.h"
#include "dtrain/common/error.h"

namespace dtrain::launcher {

// The command line of `dtrain launch` cannot work (unknown flag, -n 0, no command, ...).
class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// Where the processes of the job run (see backends.h).
enum class LauncherKind { kLocal, kSsh, kMpi, kSlurm, kSge, kRay, kSpark };

const char* LauncherName(LauncherKind kind);

// One environment variable to set in the children: NAME=VALUE.
using EnvVar = std::pair<std::string, std::string>;

struct LaunchOptions {
  int num_workers = 0;  // -n: >= 1
  // -s: defaults to num_workers. 0 starts an allreduce job (collectives, no scheduler or servers):
  // the workers rendezvous with worker 0 at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT.
  int num_servers = 0;
  LauncherKind launcher = LauncherKind::kLocal;

  std::optional<std::string> hostfile;      // -H/--hostfile: one host a line, `host[:slots]`
  std::optional<std::string> sync_dst_dir;  // --sync-dst-dir: rsync the cwd there on every host
  std::optional<std::string> interface;     // --interface: DMLC_INTERFACE for every process
  // --ssh-opts "ARGS": extra ssh client arguments (split at whitespace; no quoting), put before
  // the launcher's own so that they win, e.g. "-F cluster_config -p 2222".
  std::vector<std::string> ssh_options;

  // --env / --env-server / --env-worker, with `NAME` (no value) already resolved to the launcher's
  // own value. Applied in the order given, after the variables the launcher sets itself.
  std::vector<EnvVar> env_all;
  std::vector<EnvVar> env_server;
  std::vector<EnvVar> env_worker;

  std::optional<std::string> output_dir;  // --output-dir: also write DIR/<role>-<rank>.log
  Duration kill_grace{3000};              // --kill-grace-ms: SIGTERM -> SIGKILL
  Duration service_grace{30000};  // --service-grace-ms: services' time to exit by themselves
  // --max-restarts (torchrun's name): how many times a worker of a parameter-server job that
  // fails is replaced by a new process with its rank, in all (local and ssh launchers).
  int max_restarts = 0;

  // --host-discovery-script: an elastic allreduce job (Horovod's elastic mode; elastic_job.h).
  // The script prints `HOST[:SLOTS]` lines; workers run on free slots, between min_np and max_np.
  std::optional<std::string> host_discovery_script;
  int min_np = 0;                    // --min-np
  int max_np = 0;                    // --max-np
  Duration elastic_timeout{600000};  // --elastic-timeout (seconds on the command line)

  // The job's reports (report_sink.h): --status-port (and --status-host, --status-linger-s) serve
  // the live status page; --no-summary drops the end-of-job summary.
  std::optional<uint16_t> status_port;
  std::string status_host = "127.0.0.1";
  Duration status_linger{0};
  bool summary = true;

  // The workers' argv, ready for exec. A single argument containing whitespace (the seeds' quoted
  // spelling) has become {"/bin/sh", "-c", that string}.
  std::vector<std::string> worker_command;
};

// Looks a variable up in the launcher's environment (for `--env NAME`); nullopt when unset.
using EnvGetter = std::optional<std::string> (*)(const char* name);

// Parses the arguments that followed `dtrain launch`, in order. Returns nullopt after printing the
// help text to stdout when --help was asked for. Throws UsageError for anything else that is wrong.
//
// The user command is either everything after `--`, or everything from the first argument that is
// not one of our flags (flags after it belong to the command).
std::optional<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args,
                                             EnvGetter launcher_env = nullptr);

// The help text (also printed for --help).
std::string LaunchHelp();

}  // namespace dtrain::launcher

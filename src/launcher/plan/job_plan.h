// Which processes a job consists of, where each runs, and with which argv and environment.
//
// Building the plan is pure: no process starts and nothing is read from the system except what the
// caller passes in, so a test can check every argv and variable. The plan is made in two steps:
//   1. placement: a host for the scheduler and for every server and worker (PlaceLocally puts them
//      all on 127.0.0.1; a backend for several machines cycles through a host file instead);
//   2. BuildJobPlan: one ProcessSpec per process, with the DMLC_* variables that describe the job.
// A backend then runs the specs: the local one fork/execs each spec on this machine
// (process_group.h). A backend for other hosts would wrap each spec in a local command that
// reaches its host (ssh HOST 'env ... cmd') and hand those to the same supervisor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "launcher/plan/hostfile.h"
#include "launcher/plan/launch_options.h"

namespace dtrain::launcher {

// One process of the job.
struct ProcessSpec {
  Role role = Role::kWorker;
  int rank = 0;      // server i / worker i; 0 for the scheduler
  std::string host;  // where it runs; "127.0.0.1" for the local backend
  std::vector<std::string> argv;
  // Set on top of the launcher's own environment, in order (a later NAME wins).
  std::vector<EnvVar> env;
  // stdin is a pipe whose write end the launcher holds open, and never writes to, until the job
  // ends; otherwise /dev/null. The ssh backend gives it to each ssh client: the remote guard
  // reads it and stops the remote process at EOF, i.e. when the launcher or the connection dies.
  bool stdin_held_open = false;
  // Written to that pipe once the process has started (the ssh backend: the job secret, which the
  // remote guard reads, so that it never appears on a command line).
  std::string stdin_preamble;
  // Empty: the process runs here. Otherwise the local process is a client (e.g. "ssh") that runs
  // it on `host`, and messages name both: "worker 1 on node-b (ssh pid 4242)".
  std::string remote_via;

  // "scheduler", "server 0", "worker 1": the output prefix and the name in messages.
  std::string Name() const;
  // "scheduler.log", "server-0.log", "worker-1.log": the file name under --output-dir.
  std::string LogFileName() const;
};

struct Placement {
  std::string scheduler_host;
  std::vector<std::string> server_hosts;  // one per server, by rank
  std::vector<std::string> worker_hosts;  // one per worker, by rank
  // The address the other nodes reach a host at, where it differs from the name the launcher
  // reaches it by (ssh: "alice@node-a" or an ssh config alias -> its HostName). A host not listed
  // is its own address.
  std::map<std::string, std::string> addresses;

  const std::string& AddressOf(const std::string& host) const;
};

struct JobPlan {
  // The scheduler's address; in an allreduce job (no servers) worker 0's, which hosts the
  // collectives' rendezvous there.
  std::string scheduler_host;
  uint16_t scheduler_port = 0;
  int num_servers = 0;
  int num_workers = 0;
  // Start order: the scheduler, then servers by rank, then workers by rank.
  std::vector<ProcessSpec> processes;
};

// Every process on this machine, talking over loopback.
Placement PlaceLocally(int num_servers, int num_workers);

// The seeds' placement over a hostfile: servers and workers each cycle through the hosts (one of
// each per host when there are exactly N hosts); the scheduler runs on `launcher_host`, the
// address of the machine running `dtrain launch` as the other hosts reach it.
Placement PlaceOnHosts(const std::vector<HostEntry>& hosts, int num_servers, int num_workers,
                       const std::string& launcher_host);

// `dtrain_exe` is the binary that runs `scheduler` and `server` (normally the running dtrain,
// /proc/self/exe); workers run options.worker_command. `scheduler_port` is the port the scheduler
// will listen on.
//
// A placement without servers is an allreduce job (-s 0): workers only, no scheduler; they find
// each other through worker 0 at DMLC_PS_ROOT_URI (worker 0's address) : scheduler_port.
//
// Every process gets DMLC_NODE_HOST = its host's address, the address it announces, unless
// options.interface is set: then DMLC_INTERFACE names the interface instead (a node prefers
// DMLC_NODE_HOST over DMLC_INTERFACE, see common/net_address.h). A user's --env wins over both.
// Every worker gets DTRAIN_LOCAL_WORKERS, the number of workers on its host. Workers of an
// allreduce job also get horovodrun's HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK
// and _CROSS_SIZE, which Horovod scripts read.
JobPlan BuildJobPlan(const LaunchOptions& options, const Placement& placement,
                     const std::string& dtrain_exe, uint16_t scheduler_port);

// Sets the first `name` entry of `env` to `value` (a later entry, e.g. the user's --env, still
// wins), or appends one.
void SetEnv(std::vector<EnvVar>* env, const std::string& name, const std::string& value);

// The variables BuildJobPlan sets per rank (DTRAIN_NODE_RANK, DTRAIN_LOCAL_WORKERS,
// HOROVOD_RANK...): a cluster tool (mpirun, Slurm, SGE) places the tasks itself, so its task
// script sets the rank instead.
bool IsPerRankVariable(const std::string& name);

}  // namespace dtrain::launcher

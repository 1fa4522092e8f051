// `dtrain launch --launcher ssh`: the scheduler runs here, servers and workers on the hostfile's
// hosts, each through a local ssh client that the supervisor treats as the process itself (its
// output, its exit code, its teardown). remote_command.h explains how a remote process is tied to
// its ssh client so that nothing outlives the job.
//
// Before the job: every host's address is looked up with `ssh -G` (aliases of the ssh
// configuration resolve, "user@" drops), the scheduler's address is the local one on the route
// to the first host (or --interface's), and --sync-dst-dir copies the current directory to every
// host with rsync, all hosts at once.
//
// Under --max-restarts a replacement runs on its process's host, unless ssh to that host failed
// (code 255): then on the next host of the hostfile whose ssh has not failed (local_job.h).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "dtrain/common/error.h"
#include "launcher/plan/hostfile.h"
#include "launcher/plan/job_plan.h"
#include "launcher/plan/local_address.h"
#include "launcher/run/backends.h"
#include "launcher/run/remote_command.h"
#include "launcher/run/setup_command.h"
#include "launcher/run/ssh_hosts.h"
#include "launcher/status/report_setup.h"
#include "launcher/watch/local_job.h"

namespace dtrain::launcher {
namespace {

// rsync gives up on a transfer without progress for this long; the whole copy gets kSyncTimeout.
constexpr Duration kSyncStallTimeout{60000};
constexpr Duration kSyncTimeout{3600 * 1000};

std::vector<std::string> DistinctHosts(const std::vector<HostEntry>& hosts) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const HostEntry& h : hosts) {
    if (seen.insert(h.host).second) out.push_back(h.host);
  }
  return out;
}

// rsync to every host at once. Returns 0, or the exit code for the launcher after reporting.
int SyncWorkingDirectory(const LaunchOptions& options, const std::vector<std::string>& hosts,
                         const std::string& src) {
  std::vector<std::vector<std::string>> commands;
  for (const std::string& h : hosts) {
    std::fprintf(stderr, "dtrain launch: rsync %s/ -> %s:%s\n", src.c_str(), h.c_str(),
                 options.sync_dst_dir->c_str());
    commands.push_back(
        RsyncCommand(options.ssh_options, src, h, *options.sync_dst_dir, kSyncStallTimeout));
  }
  const std::vector<SetupResult> results = RunSetupCommands(commands, kSyncTimeout);
  int code = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (results[i].succeeded()) continue;
    std::fprintf(stderr, "dtrain launch: rsync to %s failed: %s\n", hosts[i].c_str(),
                 results[i].Describe(kSyncTimeout).c_str());
    if (code == 0) code = results[i].timed_out ? 1 : results[i].status.ShellCode();
  }
  if (code != 0) std::fprintf(stderr, "dtrain launch: not starting the job\n");
  return code;
}

std::string Count(size_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace

int RunSshJob(const LaunchOptions& options) {
  if (options.host_discovery_script) return RunElasticJob(options);
  if (!options.hostfile) {
    throw UsageError("--launcher ssh needs -H/--hostfile: the hosts to run servers and workers on");
  }
  const std::vector<HostEntry> hosts = ReadHostfile(*options.hostfile);
  const std::vector<std::string> distinct = DistinctHosts(hosts);
  const std::map<std::string, std::string> names =
      SshHostnames(options.ssh_options, distinct, "the hostfile");
  const std::string scheduler_address =
      SchedulerAddressToward(names.at(hosts[0].host), options.interface);

  Placement placement =
      PlaceOnHosts(hosts, options.num_servers, options.num_workers, scheduler_address);
  for (const auto& [host, name] : names) {
    if (host != name) placement.addresses[host] = name;
  }
  JobPlan plan = BuildJobPlan(options, placement, SelfExecutablePath(), PickFreePort());

  // The hosts that run something: fewer than the hostfile's when -n and -s are small.
  std::vector<std::string> used;
  for (const std::string& h : distinct) {
    for (const ProcessSpec& spec : plan.processes) {
      if (spec.role != Role::kScheduler && spec.host == h) {
        used.push_back(h);
        break;
      }
    }
  }

  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  if (ec) throw Error("cannot get the current directory: " + ec.message());
  if (options.sync_dst_dir) {
    if (int code = SyncWorkingDirectory(options, used, cwd); code != 0) return code;
  }
  const std::string remote_dir = options.sync_dst_dir.value_or(cwd);

  SupervisorOptions supervision;
  SetUpReports(options, &plan, &supervision);
  // Each process starts as an ssh client, its environment in the remote command; a replacement
  // moved to another host (SupervisorOptions::hosts) announces that host's address. By reference:
  // the job is supervised before this function returns.
  supervision.start_as = [&options, &remote_dir, &placement](const ProcessSpec& planned) {
    if (planned.role == Role::kScheduler) return planned;
    return RunOverSsh(options, remote_dir, planned, placement.AddressOf(planned.host));
  };
  supervision.hosts = distinct;
  if (plan.num_servers == 0) {
    std::fprintf(stderr,
                 "dtrain launch: starting %s on %s through ssh, in %s (allreduce job: no "
                 "scheduler or servers; rendezvous at %s:%u)\n",
                 Count(plan.num_workers, "worker").c_str(), Count(used.size(), "host").c_str(),
                 remote_dir.c_str(), plan.scheduler_host.c_str(),
                 static_cast<unsigned>(plan.scheduler_port));
  } else {
    std::fprintf(stderr,
                 "dtrain launch: starting 1 scheduler here (at %s:%u), %s and %s on %s through "
                 "ssh, in %s\n",
                 plan.scheduler_host.c_str(), static_cast<unsigned>(plan.scheduler_port),
                 Count(plan.num_servers, "server").c_str(),
                 Count(plan.num_workers, "worker").c_str(), Count(used.size(), "host").c_str(),
                 remote_dir.c_str());
  }
  // A remote process's exit code reaches us through sshd and the ssh client, after its peers
  // here have already reported its death; give it time to be named as the cause.
  supervision.failure_settle = Duration(1000);
  supervision.kill_grace = options.kill_grace;
  supervision.service_grace = options.service_grace;
  supervision.max_restarts = options.max_restarts;
  supervision.replace_servers = ServerCheckpointsOn();
  supervision.output_dir = options.output_dir;
  return SuperviseLocalJob(plan, supervision);
}

}  // namespace dtrain::launcher

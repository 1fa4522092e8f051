#include "launcher/plan/job_plan.h"

#include <algorithm>
#include <array>

namespace dtrain::launcher {
namespace {

constexpr char kLoopback[] = "127.0.0.1";

// The variables every node reads to find the job (see common/config/config.h), and the address it
// announces: `address`, or that of --interface.
std::vector<EnvVar> JobEnv(const JobPlan& plan, const LaunchOptions& options, Role role,
                           const std::string& address) {
  std::vector<EnvVar> env = {
      {"DMLC_ROLE", RoleName(role)},
      {"DMLC_PS_ROOT_URI", plan.scheduler_host},
      {"DMLC_PS_ROOT_PORT", std::to_string(plan.scheduler_port)},
      {"DMLC_NUM_SERVER", std::to_string(plan.num_servers)},
      {"DMLC_NUM_WORKER", std::to_string(plan.num_workers)},
  };
  // DMLC_NODE_HOST beats DMLC_INTERFACE in the node, so setting both would ignore --interface.
  if (options.interface) {
    env.emplace_back("DMLC_INTERFACE", *options.interface);
  } else {
    env.emplace_back("DMLC_NODE_HOST", address);
  }
  return env;
}

void Append(std::vector<EnvVar>* env, const std::vector<EnvVar>& more) {
  env->insert(env->end(), more.begin(), more.end());
}

// How many workers share worker `rank`'s host.
int LocalWorkers(const std::vector<std::string>& worker_hosts, int rank) {
  return static_cast<int>(std::count(worker_hosts.begin(), worker_hosts.end(), worker_hosts[rank]));
}

// horovodrun's variables for worker `rank` of an allreduce job, which Horovod scripts read before
// (or instead of) hvd.init(): local = the workers on its host, cross = the hosts that have a
// worker of its local rank, hosts in the order their first worker appears.
std::vector<EnvVar> HorovodEnv(const std::vector<std::string>& worker_hosts, int rank) {
  const std::string& host = worker_hosts[rank];
  const int local_rank =
      static_cast<int>(std::count(worker_hosts.begin(), worker_hosts.begin() + rank, host));
  const int local_size = LocalWorkers(worker_hosts, rank);
  // Per host in order of appearance: how many workers it has.
  std::vector<std::pair<std::string, int>> hosts;
  for (const std::string& h : worker_hosts) {
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& e) { return e.first == h; });
    if (it == hosts.end()) {
      hosts.emplace_back(h, 1);
    } else {
      ++it->second;
    }
  }
  int cross_rank = 0;
  int cross_size = 0;
  for (const auto& [h, workers] : hosts) {
    if (workers <= local_rank) continue;
    if (h == host) cross_rank = cross_size;
    ++cross_size;
  }
  return {{"HOROVOD_RANK", std::to_string(rank)},
          {"HOROVOD_SIZE", std::to_string(worker_hosts.size())},
          {"HOROVOD_LOCAL_RANK", std::to_string(local_rank)},
          {"HOROVOD_LOCAL_SIZE", std::to_string(local_size)},
          {"HOROVOD_CROSS_RANK", std::to_string(cross_rank)},
          {"HOROVOD_CROSS_SIZE", std::to_string(cross_size)}};
}

}  // namespace

bool IsPerRankVariable(const std::string& name) {
  static const std::array<const char*, 8> kNames = {
      "DTRAIN_NODE_RANK",   "DTRAIN_LOCAL_WORKERS", "HOROVOD_RANK",       "HOROVOD_SIZE",
      "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",   "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"};
  return std::any_of(kNames.begin(), kNames.end(), [&](const char* n) { return name == n; });
}

void SetEnv(std::vector<EnvVar>* env, const std::string& name, const std::string& value) {
  for (EnvVar& v : *env) {
    if (v.first == name) {
      v.second = value;
      return;
    }
  }
  env->push_back({name, value});
}

std::string ProcessSpec::Name() const {
  if (role == Role::kScheduler) return "scheduler";
  return std::string(RoleName(role)) + " " + std::to_string(rank);
}

std::string ProcessSpec::LogFileName() const {
  if (role == Role::kScheduler) return "scheduler.log";
  return std::string(RoleName(role)) + "-" + std::to_string(rank) + ".log";
}

const std::string& Placement::AddressOf(const std::string& host) const {
  auto it = addresses.find(host);
  return it == addresses.end() ? host : it->second;
}

Placement PlaceLocally(int num_servers, int num_workers) {
  Placement p;
  p.scheduler_host = kLoopback;
  p.server_hosts.assign(num_servers, kLoopback);
  p.worker_hosts.assign(num_workers, kLoopback);
  return p;
}

Placement PlaceOnHosts(const std::vector<HostEntry>& hosts, int num_servers, int num_workers,
                       const std::string& launcher_host) {
  // The seeds' launch.py (dmlc-tracker) puts process i of the servers-then-workers sequence on
  // hosts[i % hosts]: with 5 hosts, -s 3 -n 3, servers go to hosts 1-3 and workers to 4, 5, 1;
  // with exactly N hosts, one server and one worker on each. A host with SLOTS takes that many
  // consecutive processes per round, as mpirun fills a host's slots before the next host.
  std::vector<const std::string*> rounds;
  for (const HostEntry& h : hosts) {
    for (int s = 0; s < h.slots; ++s) rounds.push_back(&h.host);
  }
  if (rounds.empty()) throw UsageError("the hostfile lists no hosts");
  Placement p;
  p.scheduler_host = launcher_host;
  size_t next = 0;
  for (int i = 0; i < num_servers; ++i) p.server_hosts.push_back(*rounds[next++ % rounds.size()]);
  for (int i = 0; i < num_workers; ++i) p.worker_hosts.push_back(*rounds[next++ % rounds.size()]);
  return p;
}

JobPlan BuildJobPlan(const LaunchOptions& options, const Placement& placement,
                     const std::string& dtrain_exe, uint16_t scheduler_port) {
  JobPlan plan;
  plan.scheduler_port = scheduler_port;
  plan.num_servers = static_cast<int>(placement.server_hosts.size());
  plan.num_workers = static_cast<int>(placement.worker_hosts.size());
  const bool allreduce = plan.num_servers == 0;
  if (allreduce && plan.num_workers == 0) throw UsageError("a job needs at least one worker");
  plan.scheduler_host = allreduce ? placement.AddressOf(placement.worker_hosts[0])
                                  : placement.AddressOf(placement.scheduler_host);

  // User variables go after the job's own so that, e.g., --env DMLC_NODE_HOST:... wins; the
  // variables that define the layout are refused by the option parser instead.
  if (!allreduce) {
    ProcessSpec scheduler;
    scheduler.role = Role::kScheduler;
    scheduler.host = placement.scheduler_host;
    scheduler.argv = {dtrain_exe, "scheduler"};
    scheduler.env = JobEnv(plan, options, Role::kScheduler, plan.scheduler_host);
    Append(&scheduler.env, options.env_all);
    plan.processes.push_back(std::move(scheduler));
  }

  for (int i = 0; i < plan.num_servers; ++i) {
    ProcessSpec server;
    server.role = Role::kServer;
    server.rank = i;
    server.host = placement.server_hosts[i];
    server.argv = {dtrain_exe, "server"};
    server.env = JobEnv(plan, options, Role::kServer, placement.AddressOf(server.host));
    // The node asks the scheduler for this rank, so "[server i]" in the output is rank i.
    server.env.emplace_back("DTRAIN_NODE_RANK", std::to_string(i));
    Append(&server.env, options.env_all);
    Append(&server.env, options.env_server);
    plan.processes.push_back(std::move(server));
  }

  for (int i = 0; i < plan.num_workers; ++i) {
    ProcessSpec worker;
    worker.role = Role::kWorker;
    worker.rank = i;
    worker.host = placement.worker_hosts[i];
    worker.argv = options.worker_command;
    worker.env = JobEnv(plan, options, Role::kWorker, placement.AddressOf(worker.host));
    worker.env.emplace_back("DTRAIN_NODE_RANK", std::to_string(i));
    // `import dtrain` shares the host's cores among its workers (python/dtrain/_threads.py).
    worker.env.emplace_back("DTRAIN_LOCAL_WORKERS",
                            std::to_string(LocalWorkers(placement.worker_hosts, i)));
    if (allreduce) Append(&worker.env, HorovodEnv(placement.worker_hosts, i));
    Append(&worker.env, options.env_all);
    Append(&worker.env, options.env_worker);
    plan.processes.push_back(std::move(worker));
  }
  return plan;
}

}  // namespace dtrain::launcher

#include "launcher/job_plan.h"

namespace dtrain::launcher {
namespace {

constexpr char kLoopback[] = "127.0.0.1";

// The variables every node reads to find the job (see common/config.h).
std::vector<EnvVar> JobEnv(const JobPlan& plan, Role role, const std::string& host) {
  return {
      {"DMLC_ROLE", RoleName(role)},
      {"DMLC_PS_ROOT_URI", plan.scheduler_host},
      {"DMLC_PS_ROOT_PORT", std::to_string(plan.scheduler_port)},
      {"DMLC_NUM_SERVER", std::to_string(plan.num_servers)},
      {"DMLC_NUM_WORKER", std::to_string(plan.num_workers)},
      {"DMLC_NODE_HOST", host},
  };
}

void Append(std::vector<EnvVar>* env, const std::vector<EnvVar>& more) {
  env->insert(env->end(), more.begin(), more.end());
}

}  // namespace

std::string ProcessSpec::Name() const {
  if (role == Role::kScheduler) return "scheduler";
  return std::string(RoleName(role)) + " " + std::to_string(rank);
}

std::string ProcessSpec::LogFileName() const {
  if (role == Role::kScheduler) return "scheduler.log";
  return std::string(RoleName(role)) + "-" + std::to_string(rank) + ".log";
}

Placement PlaceLocally(int num_servers, int num_workers) {
  Placement p;
  p.scheduler_host = kLoopback;
  p.server_hosts.assign(num_servers, kLoopback);
  p.worker_hosts.assign(num_workers, kLoopback);
  return p;
}

JobPlan BuildJobPlan(const LaunchOptions& options, const Placement& placement,
                     const std::string& dtrain_exe, uint16_t scheduler_port) {
  JobPlan plan;
  plan.scheduler_host = placement.scheduler_host;
  plan.scheduler_port = scheduler_port;
  plan.num_servers = static_cast<int>(placement.server_hosts.size());
  plan.num_workers = static_cast<int>(placement.worker_hosts.size());

  // User variables go after the job's own so that, e.g., --env DMLC_NODE_HOST:... wins; the
  // variables that define the layout are refused by the option parser instead.
  ProcessSpec scheduler;
  scheduler.role = Role::kScheduler;
  scheduler.host = placement.scheduler_host;
  scheduler.argv = {dtrain_exe, "scheduler"};
  scheduler.env = JobEnv(plan, Role::kScheduler, scheduler.host);
  Append(&scheduler.env, options.env_all);
  plan.processes.push_back(std::move(scheduler));

  for (int i = 0; i < plan.num_servers; ++i) {
    ProcessSpec server;
    server.role = Role::kServer;
    server.rank = i;
    server.host = placement.server_hosts[i];
    server.argv = {dtrain_exe, "server"};
    server.env = JobEnv(plan, Role::kServer, server.host);
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
    worker.env = JobEnv(plan, Role::kWorker, worker.host);
    worker.env.emplace_back("DTRAIN_NODE_RANK", std::to_string(i));
    Append(&worker.env, options.env_all);
    Append(&worker.env, options.env_worker);
    plan.processes.push_back(std::move(worker));
  }
  return plan;
}

}  // namespace dtrain::launcher

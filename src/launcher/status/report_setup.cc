#include "launcher/status/report_setup.h"

#include <optional>
#include <string>

#include "common/config/config.h"
#include "launcher/plan/local_address.h"

namespace dtrain::launcher {

std::string MergedTimelinePath(const LaunchOptions& options, const EnvLookup& launcher_env) {
  // The environment the processes get: the launcher's, with --env applied in order (the last
  // value of a name wins, as in ChildEnvironment).
  const EnvLookup processes_env = [&](const std::string& name) -> std::optional<std::string> {
    for (auto it = options.env_all.rbegin(); it != options.env_all.rend(); ++it) {
      if (it->first == name) return it->second;
    }
    return launcher_env(name);
  };
  return TimelinePathFromEnvironment(EnvReader(processes_env));
}

void SetUpReports(const LaunchOptions& options, JobPlan* plan, SupervisorOptions* supervision,
                  bool other_hosts) {
  // The first process's address as the job announces it (DMLC_NODE_HOST), else its host.
  std::string toward = "127.0.0.1";
  for (const ProcessSpec& p : plan->processes) {
    if (p.role == Role::kScheduler) continue;
    toward = p.host;
    for (const EnvVar& v : p.env) {
      if (v.first == "DMLC_NODE_HOST") toward = v.second;
    }
    break;
  }
  const std::string address = SchedulerAddressToward(toward, options.interface);
  const bool loopback = !other_hosts && address.rfind("127.", 0) == 0;
  auto channel = std::make_shared<ReportChannel>(ReportChannel::Open(loopback));
  TellProcesses(plan, address, *channel);
  supervision->reports = std::move(channel);
  supervision->report_options.status_port = options.status_port;
  supervision->report_options.status_host = options.status_host;
  supervision->report_options.status_linger = options.status_linger;
  supervision->report_options.summary = options.summary;
  supervision->report_options.timeline_path = MergedTimelinePath(options, ProcessEnvironment());
  supervision->report_options.num_servers = plan->num_servers;
}

}  // namespace dtrain::launcher

#include "launcher/report/report_setup.h"

#include <cstdlib>

#include "launcher/plan/local_address.h"

namespace dtrain::launcher {
namespace {

std::string TimelinePath(const LaunchOptions& options) {
  for (const EnvVar& v : options.env_all) {
    if (v.first == "DTRAIN_TIMELINE" || v.first == "HOROVOD_TIMELINE") return v.second;
  }
  for (const char* name : {"DTRAIN_TIMELINE", "HOROVOD_TIMELINE"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return value;
  }
  return "";
}

}  // namespace

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
  supervision->report_options.timeline_path = TimelinePath(options);
  supervision->report_options.num_servers = plan->num_servers;
}

}  // namespace dtrain::launcher

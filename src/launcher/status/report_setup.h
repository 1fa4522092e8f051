// Setting a job up to report to its launcher (report_sink.h), the same way on every backend: open
// the report channel, tell every process of the plan where it is, and give the supervision the
// channel and what the flags ask for (status page, summary, and the timeline to merge when the
// launcher's environment, or --env, sets DTRAIN_TIMELINE or HOROVOD_TIMELINE).
#pragma once

#include <string>

#include "common/config/env_reader.h"
#include "launcher/plan/job_plan.h"
#include "launcher/plan/launch_options.h"
#include "launcher/watch/local_job.h"

namespace dtrain::launcher {

// The processes reach the launcher at this host's address on the route to the first process's
// host (--interface's address when given): 127.0.0.1 when they all run here, and then the channel
// listens on loopback only. `other_hosts`: it listens on every interface anyway, for processes
// added later on other hosts (an elastic job over ssh sets each one's DTRAIN_REPORT_ADDR). Throws
// dtrain::Error when it cannot listen.
void SetUpReports(const LaunchOptions& options, JobPlan* plan, SupervisorOptions* supervision,
                  bool other_hosts = false);

// The timeline file the job's processes write (Config's rule, TimelinePathFromEnvironment, on the
// environment they get: `launcher_env` with --env applied), for the launcher to merge; "" for none.
std::string MergedTimelinePath(const LaunchOptions& options, const EnvLookup& launcher_env);

}  // namespace dtrain::launcher

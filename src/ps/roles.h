// Running the scheduler and server roles of a job.
//
// `dtrain scheduler` and `dtrain server` call these; so does any program that initialises dtrain
// with DMLC_ROLE=scheduler or server (see RunRoleFromEnvironmentIfService). Each returns the
// process exit code: 0 when the job ended in order, non-zero (after logging why) when it failed.
#pragma once

#include <optional>

#include "common/config/config.h"

namespace dtrain::ps {

int RunScheduler(const Config& config);
int RunServer(const Config& config);

// If `config`'s role is scheduler or server, runs that role until the job ends and returns its
// exit code; nullopt (at once) for workers and for processes outside a job.
std::optional<int> RunRoleIfService(const Config& config);

// If DMLC_ROLE is scheduler or server, runs that role and exits the process with its code, as
// MXNet does at import. Returns for workers and for processes outside a job.
void RunRoleFromEnvironmentIfService();

}  // namespace dtrain::ps

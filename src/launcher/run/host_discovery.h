// Running an elastic job's host discovery script (--host-discovery-script): Horovod's contract.
// The script prints the hosts that may run workers now, one `HOST[:SLOTS]` a line (the hostfile's
// grammar, hostfile.h; no output: no hosts), and exits 0.
//
// Threads: the launcher's event loop, which this blocks while the script runs (at most
// `deadline`). Its exit is collected here, before the loop's SIGCHLD handler could see it.
#pragma once

#include <string>
#include <vector>

#include "dtrain/common/deadline.h"
#include "launcher/plan/hostfile.h"

namespace dtrain::launcher {

// Runs `/bin/sh -c script`, stdin from /dev/null, stderr the launcher's. Throws dtrain::Error
// saying why: it cannot start, it ran past `deadline` (then it is killed), it exited non-zero or
// printed a malformed line, or more than 1 MiB.
std::vector<HostEntry> DiscoverHosts(const std::string& script, Duration deadline);

// The script's output: ParseHostfile, where no hosts at all is an answer too.
std::vector<HostEntry> ParseDiscoveredHosts(const std::string& text);

}  // namespace dtrain::launcher

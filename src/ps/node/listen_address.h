// Where a node of the job listens, and the warning for a job open to its network.
#pragma once

#include <cstdint>
#include <string>

#include "common/config/config.h"
#include "transport/transport.h"

namespace dtrain::ps {

// Starts `transport` listening at `port` on the address the node announces to the others, when
// that is an IP address of this host (a local job then listens on loopback only, out of reach of
// other hosts), and on every interface when it is not (a host name, or an address that NAT or a
// container maps to this host). Returns the port bound. Throws Error if even that fails.
//
// Warns once per process when the job has no DTRAIN_JOB_SECRET and is reachable beyond loopback:
// then any process that can reach the port can join or disturb the job.
uint16_t ListenForJob(transport::Transport& transport, const Config& config,
                      const std::string& announced, uint16_t port);

}  // namespace dtrain::ps

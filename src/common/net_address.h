// Which address a node announces to the others.
#pragma once

#include <string>

#include "common/config/config.h"

namespace dtrain {

// True for "localhost", 127.x.x.x and ::1: an address only this machine can reach.
bool IsLoopbackHost(const std::string& host);

// The IPv4 address of interface `name`. Throws ConfigError naming DMLC_INTERFACE and listing the
// interfaces that exist when it has none.
std::string InterfaceAddress(const std::string& name);

// The address this node tells the others to reach it at: DMLC_NODE_HOST if set, else the address
// of DMLC_INTERFACE, else 127.0.0.1 when the scheduler is on loopback, else the first non-loopback
// IPv4 interface that is up (as MXNet does), else 127.0.0.1.
std::string AnnounceAddress(const Config& config);

}  // namespace dtrain

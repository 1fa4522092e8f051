// Which processes count as being on the same host.
#pragma once

#include <string>

namespace dtrain {

// Identifies this kernel boot, network namespace and pid namespace: equal ids mean "same host".
// Two network namespaces standing in for two hosts (the emulated cluster) get different ids, so
// nothing meant for processes of one host (memory reads, shared segments, pids) crosses them.
const std::string& HostId();

}  // namespace dtrain

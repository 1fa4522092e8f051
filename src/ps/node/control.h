// The JSON payloads of control messages (register, node table, barrier, failure), and the one
// place that parses them. They come off the network, so parsing is strict: a missing field or a
// wrong type is a ProtocolError, never a crash.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ps/node/node_info.h"

namespace dtrain::ps::control {

struct Registration {
  Role role = Role::kWorker;
  std::string host;
  uint16_t port = 0;
  int requested_rank = -1;  // DTRAIN_NODE_RANK, or -1
};
std::string EncodeRegistration(const Registration& r);
Registration DecodeRegistration(const std::string& json);

std::string EncodeNodeTable(const std::vector<NodeInfo>& nodes);
std::vector<NodeInfo> DecodeNodeTable(const std::string& json);

std::string EncodeBarrier(Group group, uint64_t sequence);
std::pair<Group, uint64_t> DecodeBarrier(const std::string& json);

struct Failure {
  NodeId node = transport::kNoNode;
  std::string name;    // NodeInfo::Name() of the failed node
  std::string reason;  // what happened
};
std::string EncodeFailure(const Failure& f);
Failure DecodeFailure(const std::string& json);

}  // namespace dtrain::ps::control

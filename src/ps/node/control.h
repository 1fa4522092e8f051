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

struct BarrierMessage {
  Group group = Group::kWorkers;
  uint64_t sequence = 0;
  // The barrier ends a step of the KVStore's setup (Init, SetOptimizer), which a replacement
  // repeats only where the job has not completed it (Rejoin::setup_barriers).
  bool setup = false;
  bool operator==(const BarrierMessage&) const = default;
};
std::string EncodeBarrier(Group group, uint64_t sequence, bool setup = false);
BarrierMessage DecodeBarrier(const std::string& json);

// What a replacement worker (DTRAIN_RESTART_WAIT_MS) learns before its node table: how many
// barriers of each group the job has completed, so that its own barriers join the next ones, and
// how many of the workers' were setup barriers (its program's first ones of those are done).
struct Rejoin {
  uint64_t workers_barriers = 0;
  uint64_t all_barriers = 0;
  uint64_t setup_barriers = 0;
};
std::string EncodeRejoin(const Rejoin& r);
Rejoin DecodeRejoin(const std::string& json);

struct Failure {
  NodeId node = transport::kNoNode;
  std::string name;    // NodeInfo::Name() of the failed node
  std::string reason;  // what happened
};
std::string EncodeFailure(const Failure& f);
Failure DecodeFailure(const std::string& json);

}  // namespace dtrain::ps::control

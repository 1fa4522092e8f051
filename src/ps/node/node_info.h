// Who is who in a job: node ids, roles, ranks, addresses.
//
// Ids are fixed by the layout: the scheduler is 0, server r is 1 + r, worker r is
// 1 + num_servers + r. Every error about a peer names it with NodeInfo::Name(), e.g.
// "worker 1 (10.0.0.2:41234)", so a user can tell which process on which host failed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "transport/message.h"

namespace dtrain::ps {

using transport::NodeId;

struct NodeInfo {
  NodeId id = transport::kNoNode;
  Role role = Role::kWorker;
  int rank = -1;
  std::string host;
  uint16_t port = 0;

  std::string Address() const { return host + ":" + std::to_string(port); }
  std::string Name() const;  // "server 0 (127.0.0.1:4000)"
};

// The ids of a job with `num_servers` servers.
struct JobLayout {
  int num_servers = 0;
  int num_workers = 0;

  NodeId ServerId(int rank) const { return 1 + rank; }
  NodeId WorkerId(int rank) const { return 1 + num_servers + rank; }
  int NumNodes() const { return 1 + num_servers + num_workers; }
  bool IsServer(NodeId id) const { return id >= 1 && id <= num_servers; }
  bool IsWorker(NodeId id) const { return id > num_servers && id < NumNodes(); }
  int RankOf(NodeId id) const {
    return IsServer(id) ? id - 1 : IsWorker(id) ? id - 1 - num_servers : -1;
  }
  Role RoleOf(NodeId id) const {
    return id == 0 ? Role::kScheduler : IsServer(id) ? Role::kServer : Role::kWorker;
  }
};

// Barrier groups, as in ps-lite.
enum class Group : int { kWorkers = 1, kServers = 2, kAll = 3 };
const char* GroupName(Group g);
bool InGroup(Group g, Role role);

}  // namespace dtrain::ps

// HostGroups: collectives in two levels, within each host through shared memory (shm_group.h) and
// between hosts among one leader per host.
//
// Ranks of one host (the same HostId, common/host_id.h; the network-namespace hosts of the
// emulated cluster differ) exchange through their host's ShmGroup instead of loopback TCP. With
// every rank on one host that is all there is. With several hosts each collective goes in three
// steps: within each host, among the leaders (each host's lowest rank, through the backend's
// LeaderChannel: gloo), and back within each host from its leader:
//   allreduce   the host's sum on every local rank; the leaders' allreduce; the leader's result
//               to its host.
//   allgatherv  each host's contributions as one block; the leaders' allgatherv of the blocks;
//               the leader's blocks to its host; every rank puts them in rank order (a host's
//               ranks need not be consecutive).
//   broadcast   within the root's host from the root; among the leaders from the root's host;
//               within every other host from its leader.
//   barrier     within, among, within.
// Errors (PeerError, TimeoutError) are the ShmGroup's and the channel's; the caller abandons the
// group on any of them (Abandon), so that the host's other ranks, who may wait for this one, fail
// at once with its reason.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "collectives/gloo/shm_group.h"
#include "common/elementwise.h"
#include "dtrain/common/dtype.h"

namespace dtrain::collectives {

// Which ranks share a host. Hosts are numbered in the order of their lowest rank, which leads
// each.
struct HostLayout {
  // From every rank's HostId (index = rank), as this rank sees them.
  static HostLayout FromHostIds(const std::vector<std::string>& host_ids, int rank);

  std::vector<std::vector<int>> host_ranks;  // each host's ranks, ascending
  std::vector<int> host_of_rank;             // index into host_ranks
  int my_host = 0;
  int local_rank = 0;  // this rank's index among its host's ranks

  int hosts() const { return static_cast<int>(host_ranks.size()); }
  const std::vector<int>& mine() const { return host_ranks[my_host]; }
  bool leader() const { return local_rank == 0; }
};

// The collectives among the hosts' leaders, rank = host number. Called on leaders only.
class LeaderChannel {
 public:
  virtual ~LeaderChannel() = default;
  virtual void LeadersAllreduce(void* data, size_t count, DType dtype, Reduction how) = 0;
  virtual void LeadersAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) = 0;
  virtual void LeadersBroadcast(void* data, size_t bytes, int root_host) = 0;
  virtual void LeadersBarrier() = 0;
};

class HostGroups {
 public:
  // `local`: this host's group (null when the host has one rank). `leaders`: set on leaders of a
  // layout with several hosts, null elsewhere; must outlive this.
  HostGroups(HostLayout layout, std::unique_ptr<ShmGroup> local, LeaderChannel* leaders);

  const HostLayout& layout() const { return layout_; }

  // As Communicator's (Allreduce: reduced by `how`).
  void Allreduce(const void* in, void* out, size_t count, DType dtype, Reduction how);
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes);
  void Broadcast(void* data, size_t bytes, int root);
  void Barrier();
  // As Communicator's; only where every rank shares this host (one_host()), through its memory.
  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes);

  // ShmGroup::AllreducePieces; only where every rank shares this host (one_host()).
  void AllreducePieces(std::span<const AllreducePiece> pieces, DType dtype, Reduction how,
                       double scale);

  // See ShmGroup::Abandon; nothing for a host of one rank.
  void Abandon(const std::string& reason);

  bool one_host() const { return layout_.hosts() == 1; }

 private:
  HostLayout layout_;
  std::unique_ptr<ShmGroup> local_;
  LeaderChannel* leaders_;
};

}  // namespace dtrain::collectives

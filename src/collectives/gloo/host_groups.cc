#include "collectives/gloo/host_groups.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "dtrain/common/error.h"

namespace dtrain::collectives {

HostLayout HostLayout::FromHostIds(const std::vector<std::string>& host_ids, int rank) {
  HostLayout layout;
  const int size = static_cast<int>(host_ids.size());
  layout.host_of_rank.assign(size, -1);
  for (int r = 0; r < size; ++r) {
    const int leader = static_cast<int>(std::find(host_ids.begin(), host_ids.end(), host_ids[r]) -
                                        host_ids.begin());
    if (leader == r) {
      layout.host_of_rank[r] = layout.hosts();
      layout.host_ranks.emplace_back();
    } else {
      layout.host_of_rank[r] = layout.host_of_rank[leader];
    }
    layout.host_ranks[layout.host_of_rank[r]].push_back(r);
  }
  layout.my_host = layout.host_of_rank[rank];
  const auto& mine = layout.mine();
  layout.local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  return layout;
}

HostGroups::HostGroups(HostLayout layout, std::unique_ptr<ShmGroup> local, LeaderChannel* leaders)
    : layout_(std::move(layout)), local_(std::move(local)), leaders_(leaders) {}

void HostGroups::Allreduce(const void* in, void* out, size_t count, DType dtype, Reduction how) {
  if (one_host()) return local_->Allreduce(in, out, count, dtype, how);
  const size_t bytes = count * DTypeSize(dtype);
  if (local_) {
    local_->Allreduce(in, out, count, dtype, how);
  } else if (in != out && bytes > 0) {
    std::memcpy(out, in, bytes);
  }
  if (leaders_) leaders_->LeadersAllreduce(out, count, dtype, how);
  if (local_) local_->Broadcast(out, bytes, 0);
}

void HostGroups::Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                           const std::vector<size_t>& recv_bytes) {
  if (!one_host() || !local_) {
    throw InvalidArgument("an alltoall through shared memory needs every rank on one host");
  }
  local_->Alltoallv(in, send_bytes, out, recv_bytes);
}

void HostGroups::AllreducePieces(std::span<const AllreducePiece> pieces, DType dtype, Reduction how,
                                 double scale) {
  if (!one_host() || !local_) {
    throw InvalidArgument("a fused allreduce in place needs every rank on one host");
  }
  local_->AllreducePieces(pieces, dtype, how, scale);
}

void HostGroups::Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  if (one_host()) return local_->Allgatherv(in, out, bytes);
  std::vector<size_t> host_bytes(layout_.hosts());
  for (int h = 0; h < layout_.hosts(); ++h) {
    for (int r : layout_.host_ranks[h]) host_bytes[h] += bytes[r];
  }
  std::vector<size_t> local_bytes;
  for (int r : layout_.mine()) local_bytes.push_back(bytes[r]);
  std::vector<char> block(host_bytes[layout_.my_host]);
  if (local_) {
    local_->Allgatherv(in, block.data(), local_bytes);
  } else if (!block.empty()) {
    std::memcpy(block.data(), in, block.size());
  }
  const size_t total = std::accumulate(host_bytes.begin(), host_bytes.end(), size_t{0});
  std::vector<char> blocks(total);
  if (leaders_) leaders_->LeadersAllgatherv(block.data(), blocks.data(), host_bytes);
  if (local_) local_->Broadcast(blocks.data(), total, 0);
  // Blocks come host by host; `out` is in rank order.
  std::vector<size_t> offset(bytes.size());
  for (size_t r = 0, at = 0; r < bytes.size(); at += bytes[r], ++r) offset[r] = at;
  size_t at = 0;
  for (const auto& ranks : layout_.host_ranks) {
    for (int r : ranks) {
      if (bytes[r] > 0)
        std::memcpy(static_cast<char*>(out) + offset[r], blocks.data() + at, bytes[r]);
      at += bytes[r];
    }
  }
}

void HostGroups::Broadcast(void* data, size_t bytes, int root) {
  const int root_host = layout_.host_of_rank[root];
  const auto& root_ranks = layout_.host_ranks[root_host];
  const int root_local =
      static_cast<int>(std::find(root_ranks.begin(), root_ranks.end(), root) - root_ranks.begin());
  if (one_host()) return local_->Broadcast(data, bytes, root_local);
  const bool root_here = layout_.my_host == root_host;
  if (root_here && local_) local_->Broadcast(data, bytes, root_local);
  if (leaders_) leaders_->LeadersBroadcast(data, bytes, root_host);
  if (!root_here && local_) local_->Broadcast(data, bytes, 0);
}

void HostGroups::Barrier() {
  if (local_) local_->Barrier();
  if (one_host()) return;
  if (leaders_) leaders_->LeadersBarrier();
  if (local_) local_->Barrier();
}

void HostGroups::Abandon(const std::string& reason) {
  if (local_) local_->Abandon(reason);
}

}  // namespace dtrain::collectives

// Horovod's hierarchical allreduce on GPUs (HOROVOD_HIERARCHICAL_ALLREDUCE=1): which ranks an NCCL
// allreduce meets at each of its three steps.
//
// NCCL's one communicator over every rank already chooses its rings and trees by topology. The
// hierarchical allreduce is Horovod's alternative for clusters whose links between hosts NCCL
// drives badly (or not at all): within each host an NCCL reduce-scatter leaves local rank i with
// shard i of the host's sum; the ranks holding shard i on every host (one per host) allreduce it
// in host memory over the job's backend (Gloo or MPI), all shards at once; an NCCL allgather
// within each host puts the shards back together. Every host must hold the same number of ranks,
// as Horovod requires; otherwise the job keeps NCCL's one communicator (`why` says so).
//
// Pure: every rank computes the same plan from the same list of host ids.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "collectives/gloo/host_groups.h"

namespace dtrain::collectives {

// The subset generation (Communicator::Subset) of the cross-host group of shard i is
// kCrossHostGenerations + i; process sets use generations below it (process_sets.h).
constexpr int kCrossHostGenerations = 20000;

struct NcclHierarchy {
  // Which ranks share a host. This host's communicator is layout.mine() (NCCL's rank: the index),
  // and layout.local_rank is the shard this rank carries across.
  HostLayout layout;
  std::vector<int> cross_ranks;  // the ranks at layout.local_rank on every host, ascending
};

// From every rank's host id (index = rank; common/host_id.h). nullopt, with `why` set, when the
// hosts hold different numbers of ranks.
std::optional<NcclHierarchy> PlanHierarchy(const std::vector<std::string>& host_ids, int rank,
                                           std::string* why);

// Elements of each local rank's shard of `total`: the buffer is padded to shard * local_size.
size_t ShardElements(size_t total, int local_size);

}  // namespace dtrain::collectives

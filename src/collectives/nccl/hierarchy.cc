#include "collectives/nccl/hierarchy.h"

#include <algorithm>

namespace dtrain::collectives {

std::optional<NcclHierarchy> PlanHierarchy(const std::vector<std::string>& host_ids, int rank,
                                           std::string* why) {
  HostLayout layout = HostLayout::FromHostIds(host_ids, rank);
  for (const auto& ranks : layout.host_ranks) {
    if (ranks.size() != layout.mine().size()) {
      std::string counts;
      for (const auto& each : layout.host_ranks) {
        counts += (counts.empty() ? "" : ", ") + std::to_string(each.size());
      }
      *why = "the hosts hold different numbers of ranks (" + counts +
             "): HOROVOD_HIERARCHICAL_ALLREDUCE needs as many on every host";
      return std::nullopt;
    }
  }
  NcclHierarchy plan;
  for (const auto& ranks : layout.host_ranks) plan.cross_ranks.push_back(ranks[layout.local_rank]);
  std::sort(plan.cross_ranks.begin(), plan.cross_ranks.end());
  plan.layout = std::move(layout);
  return plan;
}

size_t ShardElements(size_t total, int local_size) {
  const size_t parts = static_cast<size_t>(std::max(local_size, 1));
  return (total + parts - 1) / parts;
}

}  // namespace dtrain::collectives

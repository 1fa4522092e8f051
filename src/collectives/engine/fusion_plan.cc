#include "collectives/engine/fusion_plan.h"

#include <algorithm>

namespace dtrain::collectives {

FusionGroup GroupOf(const Descriptor& d, bool fp16_allreduce) {
  FusionGroup key;
  // NCCL reduces at the GPUs' links' rate: float16 on the wire would cost two conversions for
  // little, so device arrays go in their own dtype.
  key.on_device = d.on_device;
  // Only sums travel as float16: a product or an extreme in float16 is not what was asked for.
  const bool summed = d.op == ReduceOp::kSum || d.op == ReduceOp::kAverage;
  key.compress = fp16_allreduce && summed && d.dtype == DType::kFloat32 && !d.on_device;
  key.wire = key.compress ? DType::kFloat16 : d.dtype;
  key.op = d.op;
  return key;
}

FusionBatch PlanFirstBatch(std::vector<ReadyCollective>& ready, int rank, size_t threshold_bytes,
                           bool fp16_allreduce) {
  std::stable_sort(ready.begin(), ready.end(),
                   [](const ReadyCollective& a, const ReadyCollective& b) {
                     return a.descriptors[0].priority > b.descriptors[0].priority;
                   });
  FusionBatch plan;
  size_t batch_bytes = 0;
  for (size_t i = 0; i < ready.size(); ++i) {
    const Descriptor& mine = ready[i].descriptors[rank];
    const FusionGroup key = GroupOf(mine, fp16_allreduce);
    const size_t bytes = static_cast<size_t>(NumElements(mine.shape)) * DTypeSize(key.wire);
    const bool fits =
        plan.members.empty() || (key == plan.group && batch_bytes + bytes <= threshold_bytes);
    if (!fits) {
      plan.later.push_back(i);
      continue;
    }
    if (plan.members.empty()) plan.group = key;
    plan.members.push_back(i);
    batch_bytes += bytes;
  }
  return plan;
}

}  // namespace dtrain::collectives

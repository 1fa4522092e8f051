// Which ready allreduces run together in one fusion buffer: a pure function of the ready list, so
// that it is tested with tables (tests/collectives/fusion_plan_test.cc), no threads.
//
// Every rank holds the same ready list (negotiation.h) and so makes the same plan: the list is
// ordered by priority (rank 0's descriptor; highest first, equal ones in the order they became
// ready), and the first batch takes the first allreduce and every later one of the same fusion
// group that still fits under the threshold; whatever does not fit waits for a later batch, in
// order.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/engine/negotiation.h"

namespace dtrain::collectives {

// Allreduces that may share a fusion buffer: same element type on the wire, same op.
struct FusionGroup {
  DType wire = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  bool compress = false;   // float32 sums sent as float16 (DTRAIN_FP16_ALLREDUCE); host arrays only
  bool on_device = false;  // CUDA arrays, reduced over NCCL in a fusion buffer on the GPU

  bool operator==(const FusionGroup&) const = default;
};

FusionGroup GroupOf(const Descriptor& d, bool fp16_allreduce);

struct FusionBatch {
  std::vector<size_t> members;  // indexes into the sorted list, in the order they run
  std::vector<size_t> later;    // the rest, in order
  FusionGroup group;            // the members' group
};

// Sorts `ready` by priority (stable) and plans its first batch, from `rank`'s descriptors (a
// rank's own shapes: they agree across ranks for allreduce). An allreduce alone always makes a
// batch, however big. `ready` empty: an empty batch.
FusionBatch PlanFirstBatch(std::vector<ReadyCollective>& ready, int rank, size_t threshold_bytes,
                           bool fp16_allreduce);

}  // namespace dtrain::collectives

// The fusion planner as tables: ready allreduces in, the first batch out; no threads.
#include "collectives/engine/fusion_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace dtrain::collectives {
namespace {

ReadyCollective Ready(const std::string& name, int64_t elements, int priority = 0,
                      DType dtype = DType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Descriptor d;
  d.kind = OpKind::kAllreduce;
  d.dtype = dtype;
  d.op = op;
  d.shape = {elements};
  d.priority = priority;
  return ReadyCollective{name, {d, d}, "", {}};
}

std::vector<std::string> Names(const std::vector<ReadyCollective>& ready,
                               const std::vector<size_t>& indexes) {
  std::vector<std::string> names;
  for (size_t i : indexes) names.push_back(ready[i].name);
  return names;
}

using Names_ = std::vector<std::string>;

TEST(FusionPlan, FillsUpToTheThresholdAndKeepsTheRestInOrder) {
  // 4 bytes a float32 element: a 100-byte threshold takes 25 elements.
  std::vector<ReadyCollective> ready = {Ready("a", 10), Ready("b", 10), Ready("c", 10),
                                        Ready("d", 5)};
  const FusionBatch plan = PlanFirstBatch(ready, 0, 100, false);
  EXPECT_EQ(Names(ready, plan.members), (Names_{"a", "b", "d"}));  // c does not fit; d does
  EXPECT_EQ(Names(ready, plan.later), (Names_{"c"}));
}

TEST(FusionPlan, AnAllreduceAloneMakesABatchHoweverBig) {
  std::vector<ReadyCollective> ready = {Ready("huge", 1000), Ready("small", 1)};
  const FusionBatch plan = PlanFirstBatch(ready, 0, 16, false);
  EXPECT_EQ(Names(ready, plan.members), (Names_{"huge"}));
  EXPECT_EQ(Names(ready, plan.later), (Names_{"small"}));
}

TEST(FusionPlan, HighestPriorityFirstEqualOnesInTheirOrder) {
  std::vector<ReadyCollective> ready = {Ready("low", 1, -3), Ready("first", 1, 5),
                                        Ready("second", 1, 5), Ready("mid", 1, 0)};
  const FusionBatch plan = PlanFirstBatch(ready, 1, 1 << 20, false);
  EXPECT_EQ(Names(ready, plan.members), (Names_{"first", "second", "mid", "low"}));
  EXPECT_TRUE(plan.later.empty());
}

TEST(FusionPlan, OnlyOneGroupPerBatch) {
  std::vector<ReadyCollective> ready = {Ready("sum", 4),
                                        Ready("avg", 4, 0, DType::kFloat32, ReduceOp::kAverage),
                                        Ready("double", 4, 0, DType::kFloat64), Ready("sum2", 4)};
  const FusionBatch plan = PlanFirstBatch(ready, 0, 1 << 20, false);
  EXPECT_EQ(Names(ready, plan.members), (Names_{"sum", "sum2"}));
  EXPECT_EQ(Names(ready, plan.later), (Names_{"avg", "double"}));
  EXPECT_EQ(plan.group.op, ReduceOp::kSum);
  EXPECT_EQ(plan.group.wire, DType::kFloat32);
}

TEST(FusionPlan, Fp16AllreduceHalvesTheBytesAndGroupsFloat32AsFloat16) {
  std::vector<ReadyCollective> ready = {Ready("a", 10), Ready("b", 10),
                                        Ready("half", 10, 0, DType::kFloat16)};
  // 2 bytes an element on the wire: 40 bytes take a and b; a float16 tensor is another group
  // (nothing to convert), so it waits.
  const FusionBatch compressed = PlanFirstBatch(ready, 0, 60, true);
  EXPECT_EQ(Names(ready, compressed.members), (Names_{"a", "b"}));
  EXPECT_EQ(Names(ready, compressed.later), (Names_{"half"}));
  EXPECT_TRUE(compressed.group.compress);
  EXPECT_EQ(compressed.group.wire, DType::kFloat16);
  std::vector<ReadyCollective> again = {Ready("a", 10), Ready("b", 10),
                                        Ready("half", 10, 0, DType::kFloat16)};
  const FusionBatch plain = PlanFirstBatch(again, 0, 60, false);
  EXPECT_EQ(Names(again, plain.members), (Names_{"a"}));  // 40 + 40 > 60
  EXPECT_EQ(Names(again, plain.later), (Names_{"b", "half"}));
}

TEST(FusionPlan, NothingReadyIsAnEmptyBatch) {
  std::vector<ReadyCollective> ready;
  const FusionBatch plan = PlanFirstBatch(ready, 0, 100, false);
  EXPECT_TRUE(plan.members.empty());
  EXPECT_TRUE(plan.later.empty());
}

TEST(FusionPlan, CudaArraysFuseOnlyWithCudaArraysAndAreNeverCompressed) {
  std::vector<ReadyCollective> ready = {Ready("gpu", 10), Ready("host", 10), Ready("gpu2", 10)};
  for (const char* name : {"gpu", "gpu2"}) {
    auto& c = *std::find_if(ready.begin(), ready.end(),
                            [&](const ReadyCollective& r) { return r.name == name; });
    for (auto& d : c.descriptors) d.on_device = true;
  }
  const FusionBatch plan = PlanFirstBatch(ready, 0, 1 << 20, /*fp16_allreduce=*/true);
  EXPECT_EQ(Names(ready, plan.members), (Names_{"gpu", "gpu2"}));
  EXPECT_EQ(Names(ready, plan.later), (Names_{"host"}));
  EXPECT_TRUE(plan.group.on_device);
  EXPECT_FALSE(plan.group.compress);
  EXPECT_EQ(plan.group.wire, DType::kFloat32);
}

}  // namespace
}  // namespace dtrain::collectives

// A ParameterSync (and the Trainer around it) can be made again over the same tensors: RunElastic
// does at every membership, a program may at a new store. The gradient hooks of one that is gone
// must go with it: a later backward would otherwise call into freed memory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/kvstore/kvstore.h"
#include "dtrain/train/parameter_sync.h"

namespace dtrain::train {
namespace {

TrainerOptions SgdOfRateOne() {
  TrainerOptions options;
  options.batch_size = 1;
  options.optimizer = {"sgd", {{"learning_rate", 1.0}}};
  return options;
}

TEST(ParameterSyncLifetime, ASecondSyncOverTheSameTensorsUpdatesThemOnce) {
  auto kv = KVStore::Create("local");
  torch::Tensor w = torch::ones({4}).requires_grad_(true);
  { ParameterSync first({{w}}, *kv, SgdOfRateOne()); }
  auto kv2 = KVStore::Create("local");
  ParameterSync second({{w}}, *kv2, SgdOfRateOne());
  (w * 2).sum().backward();
  second.Step(1);
  second.WaitAll();
  // One update of the gradient 2 at rate 1, by the one sync alive.
  EXPECT_TRUE(torch::equal(w.detach(), torch::full({4}, -1.0))) << w;
}

TEST(ParameterSyncLifetime, BackwardAfterTheSyncIsGoneOnlyAccumulatesTheGradient) {
  auto kv = KVStore::Create("local");
  torch::Tensor w = torch::ones({3}).requires_grad_(true);
  { ParameterSync sync({{w}}, *kv, SgdOfRateOne()); }
  (w * 3).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(torch::equal(w.grad(), torch::full({3}, 3.0))) << w.grad();
  EXPECT_TRUE(torch::equal(w.detach(), torch::ones({3})));
}

}  // namespace
}  // namespace dtrain::train

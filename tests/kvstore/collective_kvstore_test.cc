// The "horovod" KVStore in one process (a job of one rank): the same semantics and the same errors
// as the local store. Jobs of several ranks are in tests/integration/horovod_job_test.cc.
#include "kvstore/collective_kvstore.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kv_test_support.h"

namespace dtrain {
namespace {

using kvtest::Floats;
using kvtest::InvalidArgumentFrom;
using kvtest::PullVector;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CollectiveKVStoreTest, CreatedByTypeNameAsAJobOfOneRank) {
  auto kv = KVStore::Create("horovod");
  EXPECT_EQ(kv->type(), "horovod");
  EXPECT_EQ(kv->rank(), 0);
  EXPECT_EQ(kv->num_workers(), 1);
  kv->Barrier();
}

TEST(CollectiveKVStoreTest, PushSumsDevicesAndPullReturnsTheSum) {
  auto kv = KVStore::Create("horovod");
  kv->Init(1, Floats({0, 0, 0}));
  kv->Push(1, {Floats({1, 2, 3}), Floats({10, 20, 30})}).Wait();
  EXPECT_THAT(PullVector(*kv, 1, {3}), ElementsAre(11, 22, 33));
  Array out({3});
  kv->PushPull(1, {Floats({1, 1, 1})}, {out}).Wait();
  EXPECT_THAT(out.ToVector(), ElementsAre(1, 1, 1));
}

TEST(CollectiveKVStoreTest, WithAnOptimizerPushesUpdateTheWeight) {
  auto kv = KVStore::Create("horovod");
  kv->Init(2, Floats({1, 1}));
  kv->SetOptimizer({"sgd", {{"learning_rate", 0.5}}});
  kv->Push(2, {Floats({2, 4})});
  kv->WaitAll();
  EXPECT_THAT(PullVector(*kv, 2, {2}), ElementsAre(0, -1));
  EXPECT_FALSE(kv->SaveOptimizerState().empty());
}

TEST(CollectiveKVStoreTest, BadCallsAreClearErrorsAndChangeNothing) {
  auto kv = KVStore::Create("horovod");
  kv->Init(3, Floats({5, 6}));
  EXPECT_THAT(InvalidArgumentFrom([&] {
                kv->Push(4, {Floats({1, 2})});
              }),
              HasSubstr("key 4 was never initialised"));
  EXPECT_THAT(InvalidArgumentFrom([&] {
                kv->Push(3, {Floats({1, 2, 3})});
              }),
              HasSubstr("has shape (3,) float32 but the key holds (2,) float32"));
  EXPECT_THAT(InvalidArgumentFrom([&] {
                kv->Init(3, Floats({1, 2}));
              }),
              HasSubstr("already initialised"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv->LoadOptimizerState("x"); }),
              HasSubstr("set the optimizer"));
  EXPECT_THAT(PullVector(*kv, 3, {2}), ElementsAre(5, 6));
}

}  // namespace
}  // namespace dtrain

// How ParameterSync groups parameters into keys: fusion of small parameters, and fusion under
// gradient compression that spares small keys (what is compressed must not change by fusing).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "dtrain/kvstore/kvstore.h"
#include "dtrain/train/parameter_sync.h"

namespace dtrain::train {
namespace {

// LeNet's parameter sizes, in the order the model lists them (conv1, conv2, fc1, fc2, fc3).
const std::vector<int64_t> kLeNet = {150, 6, 2400, 16, 48000, 120, 10080, 84, 840, 10};

int64_t KeysFor(const std::map<std::string, std::string>& compression) {
  auto kv = KVStore::Create("local");
  if (!compression.empty()) kv->SetGradientCompression(compression);
  std::vector<torch::Tensor> replica;
  for (int64_t n : kLeNet) replica.push_back(torch::zeros({n}).requires_grad_(true));
  TrainerOptions options;
  options.batch_size = 1;
  ParameterSync sync({replica}, *kv, options);
  return sync.num_keys();
}

// Buckets fill in backward order (last parameter first) and a parameter that travels alone closes
// the open bucket, so that a bucket is complete early in the backward pass.
TEST(ParameterSyncPlan, SmallParametersAreFused) {
  // Under 64 KB: fc3, fc2's weights (40 KB) and fc1's bias in one bucket; fc1's weights (192 KB)
  // alone; conv2 and conv1 in another bucket.
  EXPECT_EQ(KeysFor({}), 3);
  EXPECT_EQ(KeysFor({{"type", "2bit"}}), 3);  // MXNet's compression: every key, fused or not
}

TEST(ParameterSyncPlan, CompressedParametersTravelAloneAndBucketsStaySpared) {
  // Spared under 4096 values: fc3 (934), fc2's weights alone, fc1's bias, fc1's weights alone, and
  // conv2 with conv1 (2572).
  EXPECT_EQ(KeysFor({{"type", "2bit"}, {"min_elements", "4096"}}), 5);
  // Under 1000: conv2's weights (2400) travel alone too.
  EXPECT_EQ(KeysFor({{"type", "1bit"}, {"min_elements", "1000"}}), 7);
  // A bucket never reaches the bound: with 900, fc3 (934 values) needs two.
  EXPECT_EQ(KeysFor({{"type", "1bit"}, {"min_elements", "900"}}), 8);
}

// Where the optimizer runs when the user does not say: on the store's side (the servers, the
// collectives' store, the local store), except for a local store with CUDA parameters, where it
// runs on their GPU in the worker.
TEST(ParameterSyncPlan, TheOptimizerRunsOnTheGpuForLocalStoresByDefault) {
  EXPECT_FALSE(DefaultUpdateOnKVStore("local", true));
  EXPECT_FALSE(DefaultUpdateOnKVStore("device", true));
  for (const char* type : {"local", "device", "dist_sync", "dist_sync_device", "dist_async",
                           "dist_async_device", "horovod"}) {
    EXPECT_TRUE(DefaultUpdateOnKVStore(type, false)) << type;
  }
  for (const char* type : {"dist_sync", "dist_sync_device", "dist_async", "horovod"}) {
    EXPECT_TRUE(DefaultUpdateOnKVStore(type, true)) << type;
  }
}

}  // namespace
}  // namespace dtrain::train

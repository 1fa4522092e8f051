// bfloat16 and float16 parameters train through float32 master weights (MXNet's multi_precision):
// updates too small for the parameter's own precision still add up. Each step here moves a weight
// of 1 by less than half the dtype's step below 1 (bfloat16: 0.001 against 2^-8; float16: 0.0001
// against 2^-11), so updating the half-precision weight itself would leave it at 1 forever;
// through a float32 master it reaches the rounding of 1 - 10 x the step after ten.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ostream>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/kvstore/kvstore.h"
#include "dtrain/train/parameter_sync.h"

namespace dtrain::train {
namespace {

struct Case {
  std::string name;
  torch::ScalarType dtype;
  int64_t numel;  // 4: fused with the float32 bias; 40,000: a key of its own
  bool update_on_kvstore;
  float learning_rate = 0.001f;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class HalfPrecision : public testing::TestWithParam<Case> {};

TEST_P(HalfPrecision, SmallUpdatesAddUpInFloat32MasterWeights) {
  const Case& c = GetParam();
  auto kv = KVStore::Create("local");
  torch::Tensor w = torch::ones({c.numel}, c.dtype).requires_grad_(true);
  torch::Tensor bias = torch::zeros({2}).requires_grad_(true);  // float32, beside it
  TrainerOptions options;
  options.batch_size = 1;
  options.update_on_kvstore = c.update_on_kvstore;
  options.optimizer = {"sgd", {{"learning_rate", static_cast<double>(c.learning_rate)}}};
  ParameterSync sync({{w, bias}}, *kv, options);
  float master = 1.0f;
  for (int step = 0; step < 10; ++step) {
    sync.WaitFor(std::vector<size_t>{0, 1});
    (w.sum() + bias.sum()).backward();  // gradients of 1: exact in every dtype
    sync.Step(1);
    master -= c.learning_rate;
  }
  sync.WaitAll();
  EXPECT_EQ(w.scalar_type(), c.dtype);
  const torch::Tensor want = torch::full({c.numel}, master).to(c.dtype);
  EXPECT_FALSE(torch::equal(want, torch::ones({c.numel}, c.dtype)));
  EXPECT_TRUE(torch::equal(w.detach(), want)) << w.detach()[0] << " against " << want[0];
  EXPECT_TRUE(torch::allclose(bias.detach(), torch::full({2}, -10 * c.learning_rate)));
}

INSTANTIATE_TEST_SUITE_P(
    ParameterSync, HalfPrecision,
    testing::Values(Case{"BFloat16Fused", torch::kBFloat16, 4, true},
                    Case{"BFloat16OwnKey", torch::kBFloat16, 40000, true},
                    Case{"BFloat16UpdatedHere", torch::kBFloat16, 40000, false},
                    Case{"Float16OwnKey", torch::kFloat16, 40000, true, 0.0001f}),
    [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(HalfPrecisionRefusal, Float64ParametersAreRefusedByName) {
  auto kv = KVStore::Create("local");
  torch::Tensor w = torch::ones({3}, torch::kFloat64).requires_grad_(true);
  try {
    ParameterSync sync({{w}}, *kv, TrainerOptions());
    FAIL() << "a float64 parameter was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 0 of replica 0 is float64"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dtrain::train

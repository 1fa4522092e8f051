// An embedding with sparse gradients (nn::Embedding with sparse(true), PyTorch's choice for big
// vocabularies) trains exactly as the same embedding with dense gradients: the sync sends them
// dense, fused into a bucket or as a key of their own, updated in the store or here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ostream>
#include <string>

#include "dtrain/kvstore/kvstore.h"
#include "dtrain/train/parameter_sync.h"

namespace dtrain::train {
namespace {

struct Case {
  std::string name;
  int64_t rows;  // 40 rows of 8: fused (under 64 KiB); 4,000 rows: a key of its own
  bool update_on_kvstore;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The embedding's weights after three steps of SGD with momentum over a local store, with its
// gradients sparse or dense. Token 3 repeats within the batch, so a sparse gradient holds one row
// twice.
torch::Tensor Train(const Case& c, bool sparse) {
  torch::manual_seed(7);
  torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(c.rows, 8).sparse(sparse));
  torch::nn::Linear head(8, 2);
  auto kv = KVStore::Create("local");
  TrainerOptions options;
  options.batch_size = 4;
  options.update_on_kvstore = c.update_on_kvstore;
  options.optimizer = {"sgd", {{"learning_rate", 0.5}, {"momentum", 0.9}}};
  ParameterSync sync({{embedding->weight, head->weight, head->bias}}, *kv, options);
  const torch::Tensor tokens = torch::tensor({int64_t{3}, int64_t{1}, int64_t{3}, c.rows - 1});
  for (int step = 0; step < 3; ++step) {
    sync.WaitFor(std::vector<size_t>{0, 1, 2});
    head(embedding(tokens)).pow(2).sum().backward();
    EXPECT_EQ(embedding->weight.grad().is_sparse(), sparse);
    sync.Step(4);
  }
  sync.WaitAll();
  return embedding->weight.detach().clone();
}

class SparseGradients : public testing::TestWithParam<Case> {};

TEST_P(SparseGradients, TrainAsTheirDenseForms) {
  const torch::Tensor dense = Train(GetParam(), /*sparse=*/false);
  const torch::Tensor sparse = Train(GetParam(), /*sparse=*/true);
  // The update moved the rows the batch used, and only those.
  torch::manual_seed(7);
  const torch::Tensor initial =
      torch::nn::Embedding(torch::nn::EmbeddingOptions(GetParam().rows, 8))->weight.detach();
  EXPECT_FALSE(torch::equal(dense[3], initial[3]));
  EXPECT_TRUE(torch::equal(dense[2], initial[2]));
  EXPECT_TRUE(torch::allclose(sparse, dense, /*rtol=*/1e-6, /*atol=*/1e-7))
      << (sparse - dense).abs().max();
}

INSTANTIATE_TEST_SUITE_P(ParameterSync, SparseGradients,
                         testing::Values(Case{"Fused", 40, true}, Case{"OwnKey", 4000, true},
                                         Case{"UpdatedHere", 4000, false}),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dtrain::train

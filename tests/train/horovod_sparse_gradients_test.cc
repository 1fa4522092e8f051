// The LibTorch DistributedOptimizer takes an embedding's sparse gradient (nn::Embedding with
// sparse(true)) as Horovod's sparse_as_dense: averaged dense, then stepped by the wrapped
// optimizer as the same embedding with dense gradients would be. One rank (no launcher): the
// average of one is the gradient itself, so the weights must match plain LibTorch exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "dtrain/collectives/collectives.h"
#include "dtrain/train/horovod.h"

namespace dtrain::train {
namespace {

struct Net : torch::nn::Module {
  explicit Net(bool sparse)
      : embedding(register_module(
            "embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(50, 4).sparse(sparse)))),
        head(register_module("head", torch::nn::Linear(4, 1))) {}
  torch::Tensor forward(const torch::Tensor& tokens) { return head(embedding(tokens)).sum(); }
  torch::nn::Embedding embedding;
  torch::nn::Linear head;
};

torch::Tensor Train(bool sparse, bool distributed) {
  torch::manual_seed(3);
  auto net = std::make_shared<Net>(sparse);
  auto sgd = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                 torch::optim::SGDOptions(0.1).momentum(0.9));
  const torch::Tensor tokens = torch::tensor({int64_t{7}, int64_t{2}, int64_t{7}, int64_t{49}});
  if (!distributed) {
    for (int step = 0; step < 3; ++step) {
      sgd->zero_grad();
      net->forward(tokens).backward();
      sgd->step();
    }
    return net->embedding->weight.detach().clone();
  }
  horovod::DistributedOptimizer optimizer(std::move(sgd), *net);
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    net->forward(tokens).backward();
    optimizer.step();
  }
  return net->embedding->weight.detach().clone();
}

TEST(HorovodSparseGradients, StepAsTheirDenseForms) {
  collectives::Init();
  const torch::Tensor sparse = Train(/*sparse=*/true, /*distributed=*/true);
  collectives::Shutdown();
  const torch::Tensor dense = Train(/*sparse=*/false, /*distributed=*/false);
  EXPECT_TRUE(torch::allclose(sparse, dense, /*rtol=*/1e-6, /*atol=*/1e-7))
      << (sparse - dense).abs().max();
  torch::manual_seed(3);
  const torch::Tensor initial = Net(false).embedding->weight.detach();
  EXPECT_FALSE(torch::equal(dense[7], initial[7]));  // the batch's rows were trained
}

}  // namespace
}  // namespace dtrain::train

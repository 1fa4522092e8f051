// The LibTorch DistributedOptimizer takes an embedding's sparse gradient (nn::Embedding with
// sparse(true)) as Horovod's sparse_as_dense: averaged dense, then stepped by the wrapped
// optimizer as the same embedding with dense gradients would be; or, with
// SparseGradients::kAllgather, as rows gathered from every rank. One rank (no launcher): the
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

torch::Tensor Train(bool sparse, bool distributed,
                    horovod::SparseGradients mode = horovod::SparseGradients::kAsDense) {
  torch::manual_seed(3);
  auto net = std::make_shared<Net>(sparse);
  // Momentum needs dense gradients; with rows gathered the optimizer must take sparse ones.
  std::unique_ptr<torch::optim::Optimizer> sgd;
  if (mode == horovod::SparseGradients::kAllgather) {
    sgd = std::make_unique<torch::optim::Adagrad>(net->parameters(),
                                                  torch::optim::AdagradOptions(0.1));
  } else {
    sgd = std::make_unique<torch::optim::SGD>(net->parameters(),
                                              torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  const torch::Tensor tokens = torch::tensor({int64_t{7}, int64_t{2}, int64_t{7}, int64_t{49}});
  if (!distributed) {
    for (int step = 0; step < 3; ++step) {
      sgd->zero_grad();
      net->forward(tokens).backward();
      sgd->step();
    }
    return net->embedding->weight.detach().clone();
  }
  horovod::DistributedOptimizer optimizer(std::move(sgd), *net, horovod::Compression::kNone, mode);
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    net->forward(tokens).backward();
    optimizer.step();
    // Gathered rows reach the optimizer as rows: the table's gradient stays sparse.
    EXPECT_EQ(net->embedding->weight.grad().is_sparse(),
              mode == horovod::SparseGradients::kAllgather);
  }
  if (mode == horovod::SparseGradients::kAllgather) {
    // A step whose backward does not reach the table gathers no row (every rank still takes
    // part), and the optimizer leaves the table as it was.
    const torch::Tensor before = net->embedding->weight.detach().clone();
    optimizer.zero_grad();
    net->head(torch::ones({1, 4})).sum().backward();
    optimizer.step();
    EXPECT_TRUE(torch::equal(net->embedding->weight.detach(), before));
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

// kAllgather (Horovod's sparse_as_dense=False): the rows every rank touched, gathered and
// averaged, reach the wrapped optimizer as a sparse gradient; Adagrad then steps exactly as
// LibTorch's own on the same sparse gradient (one rank: the average of one is itself).
TEST(HorovodSparseGradients, GatheredRowsStepAsLibTorchsOwn) {
  collectives::Init();
  const torch::Tensor gathered =
      Train(/*sparse=*/true, /*distributed=*/true, horovod::SparseGradients::kAllgather);
  collectives::Shutdown();
  const torch::Tensor own =
      Train(/*sparse=*/true, /*distributed=*/false, horovod::SparseGradients::kAllgather);
  EXPECT_TRUE(torch::allclose(gathered, own, /*rtol=*/1e-6, /*atol=*/1e-7))
      << (gathered - own).abs().max();
  torch::manual_seed(3);
  const torch::Tensor initial = Net(false).embedding->weight.detach();
  EXPECT_FALSE(torch::equal(gathered[7], initial[7]));
  EXPECT_TRUE(torch::equal(gathered[8], initial[8]));  // no batch touched it
}

}  // namespace
}  // namespace dtrain::train

// dtrain-horovod-example: a LibTorch training loop in Horovod's style, on Fashion-MNIST.
//
//   mpirun -np 2 dtrain-horovod-example                 # OpenMPI
//   dtrain launch -n 2 -s 0 -- dtrain-horovod-example   # Gloo, no mpirun
//   dtrain launch -n 2 -s 0 -- dtrain-horovod-example --gpus   # each rank on its local rank's GPU
//
// Every step takes the next global batch; each rank trains on its slice of it, and the
// DistributedOptimizer averages the gradients, so N ranks follow the same path as one process
// given the whole global batch. The model starts from rank 0's weights (BroadcastParameters).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "dtrain/collectives/collectives.h"
#include "dtrain/common/error.h"
#include "dtrain/train/data/dataset.h"
#include "dtrain/train/horovod.h"
#include "dtrain/train/models/network.h"

namespace {

namespace hvd = dtrain::train::horovod;
namespace coll = dtrain::collectives;

struct Flags {
  std::string network = "lenet";
  std::string dataset = "fashion-mnist";
  std::string data_dir;
  bool gpus = false;  // train on the GPU of this rank's local rank
  int64_t global_batch = 64;
  int64_t steps = 500;
  double lr = 0.05;
  bool fp16 = false;
  std::string out;  // raw float32 parameters after training (rank 0)
};

double Accuracy(dtrain::train::Network& net, const dtrain::train::ImageDataset& test,
                const torch::Device& device) {
  torch::NoGradGuard no_grad;
  net.eval();
  auto logits = net.forward(test.images.to(device)).cpu();
  net.train();
  return logits.argmax(1).eq(test.labels).to(torch::kFloat64).mean().item<double>();
}

// The CPU, or with --gpus the GPU of this rank's local rank (as Horovod's examples pick it).
torch::Device DeviceOf(const Flags& f) {
  if (!f.gpus) return torch::Device(torch::kCPU);
  if (!torch::cuda::is_available()) {
    throw dtrain::InvalidArgument("--gpus, but torch sees no CUDA device here");
  }
  const int count = static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(coll::LocalRank() % count));
}

void WriteParameters(dtrain::train::Network& net, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& p : net.parameters()) {
    const torch::Tensor t = p.detach().cpu().contiguous();
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  }
}

int Run(const Flags& f) {
  coll::Init();
  const int rank = coll::Rank(), size = coll::Size();
  if (f.global_batch % size != 0) {
    throw dtrain::InvalidArgument("--global-batch " + std::to_string(f.global_batch) +
                                  " does not split over " + std::to_string(size) + " ranks");
  }
  torch::set_num_threads(1);
  const torch::Device device = DeviceOf(f);
  const std::string dir =
      f.data_dir.empty() ? dtrain::train::DefaultDataDir(f.dataset) : f.data_dir;
  auto train = dtrain::train::LoadDataset(f.dataset, dir, dtrain::train::Split::kTrain);
  auto test = dtrain::train::LoadDataset(f.dataset, dir, dtrain::train::Split::kTest);
  const auto sizes = train.images.sizes();

  torch::manual_seed(1000 + rank);  // different on purpose: rank 0's weights must win
  auto net =
      dtrain::train::MakeNetwork(f.network, {sizes[1], sizes[2], sizes[3]}, train.num_classes);
  net->to(device);
  hvd::BroadcastParameters(*net, 0);
  hvd::DistributedOptimizer optimizer(
      std::make_unique<torch::optim::SGD>(net->parameters(),
                                          torch::optim::SGDOptions(f.lr).momentum(0.9)),
      *net, f.fp16 ? hvd::Compression::kFp16 : hvd::Compression::kNone);

  const int64_t local = f.global_batch / size;
  torch::manual_seed(7);  // the same order of examples on every rank
  const torch::Tensor order = torch::randperm(train.size());
  for (int64_t step = 0; step < f.steps; ++step) {
    const int64_t start = (step * f.global_batch) % (train.size() - f.global_batch);
    const torch::Tensor idx = order.narrow(0, start + rank * local, local);
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(
        net->forward(train.images.index({idx}).to(device)), train.labels.index({idx}).to(device));
    loss.backward();
    optimizer.step();
  }
  const double acc = Accuracy(*net, test, device);
  // Every rank holds the same weights, so the average of the accuracies is each one's, and the
  // gathered ranks are 0..size-1: a check of Allreduce and Allgather on tensors where training ran.
  torch::Tensor mean_acc = torch::full({1}, acc, torch::dtype(torch::kFloat64).device(device));
  hvd::Allreduce("accuracy", mean_acc, coll::ReduceOp::kAverage);
  const torch::Tensor ranks =
      hvd::Allgather("ranks", torch::full({1}, rank, torch::dtype(torch::kFloat32).device(device)))
          .cpu();
  if (std::abs(mean_acc.item<double>() - acc) > 1e-9 ||
      !torch::equal(ranks, torch::arange(size, torch::kFloat32))) {
    throw dtrain::Error("ranks disagree after training: mean accuracy " +
                        std::to_string(mean_acc.item<double>()) + ", this rank's " +
                        std::to_string(acc));
  }
  // CUDA tensors go over NCCL where it is enabled, else through host memory.
  const bool nccl = device.is_cuda() && coll::NcclEnabled();
  std::printf("rank %d of %d (%s, %s%s): %lld steps of global batch %lld, Test_acc %.4f\n", rank,
              size, coll::Backend() == coll::BackendKind::kMpi ? "mpi" : "gloo",
              device.str().c_str(), nccl ? ", nccl" : "", static_cast<long long>(f.steps),
              static_cast<long long>(f.global_batch), acc);
  if (!f.out.empty() && rank == 0) WriteParameters(*net, f.out);
  coll::Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Horovod-style training on Fashion-MNIST with dtrain's collectives"};
  Flags f;
  app.add_option("--network", f.network, "mlp, lenet, ...");
  app.add_option("--dataset", f.dataset, "fashion-mnist, mnist, cifar10 or synthetic");
  app.add_option("--data-dir", f.data_dir);
  app.add_flag("--gpus", f.gpus, "train on the GPU of this rank's local rank");
  app.add_option("--global-batch", f.global_batch, "examples per step over all ranks");
  app.add_option("--steps", f.steps);
  app.add_option("--lr", f.lr);
  app.add_flag("--fp16", f.fp16, "compress gradients to float16 on the wire");
  app.add_option("--out", f.out, "write the final parameters here (rank 0)");
  CLI11_PARSE(app, argc, argv);
  try {
    return Run(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-horovod-example: error: %s\n", e.what());
    return 1;
  }
}

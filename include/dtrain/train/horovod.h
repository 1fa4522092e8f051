// Allreduce mode for LibTorch programs, in the manner of Horovod's torch API:
//
//   dtrain::collectives::Init();
//   auto net = std::make_shared<Net>();
//   dtrain::train::horovod::BroadcastParameters(*net, /*root=*/0);  // everyone starts alike
//   dtrain::train::horovod::DistributedOptimizer opt(
//       std::make_unique<torch::optim::SGD>(net->parameters(), 0.1 * Size()), *net);
//   for (...) { opt.zero_grad(); loss.backward(); opt.step(); }
//
// The distributed optimizer allreduces (averages) each gradient as soon as backward produces it,
// from an autograd hook, so communication overlaps the rest of backward; step() waits for them
// all, writes the averages into .grad and runs the wrapped optimizer. Tensors travel under their
// parameter names, so ranks may produce gradients in different orders. The Trainer does not use
// this class: it reaches allreduce through the "horovod" KVStore.
//
// Compression::kFp16 sends float16 copies of the gradients (half the bytes; the sum is computed in
// float16 by the backend, so expect about 3 significant digits).
//
// CUDA tensors (a CUDA build of torch, and dtrain built with the CUDA toolkit) go over NCCL where
// collectives::NcclEnabled() (one GPU per rank: the launcher's local rank picks it), reading them
// after the work queued on torch's current stream; otherwise they are copied to host memory,
// reduced there and copied back, as Horovod's host path does (which lets ranks share a GPU).
//
// Threads: call from the training thread; hooks run on autograd's threads.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/collectives/collectives.h"

namespace dtrain::train::horovod {

enum class Compression { kNone, kFp16 };

// An embedding's sparse gradient (torch::nn::Embedding or EmbeddingBag with sparse(true)), as
// Horovod's sparse_as_dense chooses: kAsDense averages its dense form (a whole table crosses
// each step); kAllgather gathers every rank's rows (ids and values, the values divided by the
// number of ranks), so only the rows the batches touched cross, and the wrapped optimizer gets
// a sparse gradient (uncoalesced: a row several ranks touched appears once per rank) to apply, as
// torch's Adagrad, SGD without momentum or SparseAdam do. Horovod's default is kAllgather (its
// sparse_as_dense=False); here kAsDense stays the default, as this class always did.
enum class SparseGradients { kAsDense, kAllgather };

// A dtrain Array viewing a contiguous CPU or CUDA tensor's memory (kept alive by the Array); a
// CUDA one records torch's current stream on its device, which collectives wait for.
Array ArrayView(const torch::Tensor& tensor);

// Copies root's parameters and buffers into every rank's, by name. Call on every rank.
void BroadcastParameters(torch::nn::Module& module, int root = 0);

// Allreduces a tensor in place (sum or average) and waits; `name` must be the same on every rank.
void Allreduce(const std::string& name, torch::Tensor& tensor,
               collectives::ReduceOp op = collectives::ReduceOp::kAverage,
               Compression compression = Compression::kNone);

// Concatenates every rank's tensor along the first dimension, in rank order, on the tensor's
// device. The result keeps the memory the collective wrote (NCCL's is outside torch's caching
// allocator and freed with cudaFree), so it cannot be resized; clone() it for that.
torch::Tensor Allgather(const std::string& name, const torch::Tensor& tensor);

class DistributedOptimizer {
 public:
  // `module` names the parameters (their collective names); `inner` must optimise those same
  // parameters. Throws InvalidArgument for parameters that are not float32, or neither on the CPU
  // nor on a GPU.
  DistributedOptimizer(std::unique_ptr<torch::optim::Optimizer> inner, torch::nn::Module& module,
                       Compression compression = Compression::kNone,
                       SparseGradients sparse = SparseGradients::kAsDense);
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  void zero_grad();
  // Waits for every gradient's allreduce (a parameter backward did not reach counts as zero, as
  // every rank must take part), then steps the wrapped optimizer.
  void step();

  torch::optim::Optimizer& inner() { return *inner_; }

 private:
  struct Param;
  void Submit(Param& p, const torch::Tensor& grad);
  void SubmitRows(Param& p, const torch::Tensor& grad);
  torch::Tensor GatheredRows(Param& p);

  std::unique_ptr<torch::optim::Optimizer> inner_;
  Compression compression_;
  std::vector<std::unique_ptr<Param>> params_;
  std::mutex mutex_;
};

}  // namespace dtrain::train::horovod

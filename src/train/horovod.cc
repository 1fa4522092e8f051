#include "dtrain/train/horovod.h"

#include <set>

#include "dtrain/common/error.h"
#include "train/tensor_array.h"
#include "train/tensor_dtype.h"
#include "train/torch_cuda.h"

namespace dtrain::train::horovod {
namespace {

DType DTypeOf(const torch::Tensor& t) {
  if (const auto dtype = train::DTypeOf(t.scalar_type())) return *dtype;
  throw InvalidArgument(std::string("collectives move float tensors only, not ") +
                        std::string(c10::toString(t.scalar_type())));
}

// Whether the engine takes `t` where it is: host tensors always, CUDA tensors when they go over
// NCCL. Otherwise they are staged through host memory, as Horovod's host path does.
bool EngineTakes(const torch::Tensor& t) { return !t.is_cuda() || collectives::NcclEnabled(); }

// Where the engine takes a copy of `t`: its own device, or the host.
torch::Device EngineDevice(const torch::Tensor& t) {
  return EngineTakes(t) ? t.device() : torch::Device(torch::kCPU);
}

// What travels for `grad`: a contiguous copy (the caller's tensor belongs to autograd and may be
// reused), float16 with compression, where the engine takes it. A sparse gradient (an embedding's)
// travels dense, as with Horovod's sparse_as_dense.
torch::Tensor SendBuffer(const torch::Tensor& grad, Compression compression) {
  const auto dtype = compression == Compression::kFp16 ? torch::kFloat16 : grad.scalar_type();
  if (grad.is_sparse()) return grad.to_dense().to(EngineDevice(grad), dtype).contiguous();
  return grad.detach()
      .to(EngineDevice(grad), dtype, /*non_blocking=*/false, /*copy=*/true)
      .contiguous();
}

}  // namespace

Array ArrayView(const torch::Tensor& tensor) {
  if (!(tensor.device().is_cpu() || tensor.is_cuda()) || !tensor.is_contiguous()) {
    throw InvalidArgument("collectives need contiguous CPU or CUDA tensors, not a" +
                          std::string(tensor.is_contiguous() ? "" : " non-contiguous") +
                          " tensor on " + tensor.device().str());
  }
  return train::ArrayOverTensor(tensor, DTypeOf(tensor),
                                tensor.is_cuda() ? CurrentCudaStream(tensor.device()) : nullptr);
}

void BroadcastParameters(torch::nn::Module& module, int root) {
  torch::NoGradGuard no_grad;
  auto broadcast = [root](const std::string& name, torch::Tensor& t) {
    // A non-contiguous parameter (rare), or a CUDA one staged through the host, travels through a
    // contiguous copy.
    torch::Tensor buffer = t.to(EngineDevice(t)).contiguous();
    collectives::Broadcast("param." + name, ArrayView(buffer), root);
    if (!buffer.is_same(t)) t.copy_(buffer);
  };
  for (auto& item : module.named_parameters(true)) broadcast(item.key(), item.value());
  for (auto& item : module.named_buffers(true)) broadcast("buffer." + item.key(), item.value());
}

void Allreduce(const std::string& name, torch::Tensor& tensor, collectives::ReduceOp op,
               Compression compression) {
  torch::NoGradGuard no_grad;
  // Uncompressed, a contiguous tensor the engine takes is reduced in its own memory; otherwise
  // through a copy.
  const bool in_place =
      compression == Compression::kNone && tensor.is_contiguous() && EngineTakes(tensor);
  torch::Tensor buffer = in_place ? tensor : SendBuffer(tensor, compression);
  const Array view = ArrayView(buffer);
  collectives::Allreduce(name, view, view, op);
  if (!in_place) tensor.copy_(buffer);
}

torch::Tensor Allgather(const std::string& name, const torch::Tensor& tensor) {
  const torch::Tensor input = tensor.detach().to(EngineDevice(tensor)).contiguous();
  const Array gathered = collectives::Allgather(name, ArrayView(input));
  // The result keeps the memory the collective wrote (host, or the GPU's from NCCL).
  return train::TensorOverArray(gathered).to(tensor.device());
}

struct DistributedOptimizer::Param {
  std::string name;
  torch::Tensor weight;
  torch::Tensor buffer;  // the gradient on its way (float32, or float16 compressed)
  collectives::Handle handle;
  bool submitted = false;
  // SparseGradients::kAllgather, for a sparse embedding's table: `buffer` holds its rows' values
  // and `ids` their row numbers, each allgathered.
  bool rows = false;
  torch::Tensor ids;
  collectives::Handle ids_handle;
};

namespace {

// The tables of the embeddings with sparse gradients in `module`, by parameter name.
std::set<std::string> SparseTables(torch::nn::Module& module) {
  std::set<std::string> names;
  for (const auto& item : module.named_modules()) {
    const auto* e = item.value()->as<torch::nn::EmbeddingImpl>();
    const auto* bag = item.value()->as<torch::nn::EmbeddingBagImpl>();
    if ((e && e->options.sparse()) || (bag && bag->options.sparse())) {
      names.insert(item.key().empty() ? "weight" : item.key() + ".weight");
    }
  }
  return names;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(std::unique_ptr<torch::optim::Optimizer> inner,
                                           torch::nn::Module& module, Compression compression,
                                           SparseGradients sparse)
    : inner_(std::move(inner)), compression_(compression) {
  const std::set<std::string> tables =
      sparse == SparseGradients::kAllgather ? SparseTables(module) : std::set<std::string>();
  for (auto& item : module.named_parameters(true)) {
    const torch::Tensor& w = item.value();
    if (!w.requires_grad()) continue;
    if (w.scalar_type() != torch::kFloat32 || !(w.device().is_cpu() || w.is_cuda())) {
      throw InvalidArgument("DistributedOptimizer: parameter " + item.key() +
                            " is not a float32 CPU or CUDA tensor");
    }
    auto p = std::make_unique<Param>();
    p->name = "grad." + item.key();
    p->weight = w;
    p->rows = tables.count(item.key()) != 0;
    Param* raw = p.get();
    p->weight.register_hook([this, raw](torch::Tensor grad) { Submit(*raw, grad); });
    params_.push_back(std::move(p));
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  // Collectives still running read our buffers: wait for them, and swallow their errors (the
  // step that failed has already reported them).
  for (auto& p : params_) {
    if (!p->submitted) continue;
    try {
      p->handle.Wait();
      if (p->rows) p->ids_handle.Wait();
    } catch (...) {
    }
  }
}

void DistributedOptimizer::Submit(Param& p, const torch::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (p.submitted) {
    throw InvalidArgument("DistributedOptimizer: gradient of " + p.name +
                          " produced twice before step() (one backward per step)");
  }
  if (p.rows) {
    SubmitRows(p, grad);
  } else {
    p.buffer = SendBuffer(grad, compression_);
    const Array view = ArrayView(p.buffer);
    p.handle = collectives::AllreduceAsync(p.name, view, view, collectives::ReduceOp::kAverage);
  }
  p.submitted = true;
}

void DistributedOptimizer::SubmitRows(Param& p, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  // Every rank gathers under the same names each step, whatever its gradient's form: a dense one
  // (zeros, for a table backward did not reach) sends its nonzero rows.
  const torch::Tensor rows = (grad.is_sparse() ? grad : grad.to_sparse(1)).coalesce();
  const auto dtype = compression_ == Compression::kFp16 ? torch::kFloat16 : torch::kFloat32;
  p.buffer = rows.values().to(EngineDevice(grad), dtype).contiguous();
  // Row numbers travel as float64 (the collectives move float types), exact below 2^53.
  p.ids = rows.indices()[0].to(EngineDevice(grad), torch::kFloat64).contiguous();
  p.ids_handle = collectives::AllgatherAsync(p.name + ".ids", ArrayView(p.ids));
  p.handle = collectives::AllgatherAsync(p.name + ".values", ArrayView(p.buffer));
}

torch::Tensor DistributedOptimizer::GatheredRows(Param& p) {
  p.ids_handle.Wait();
  // Shaped again from the weight's: a gather of no rows at all may come back flat.
  std::vector<int64_t> row_shape(p.weight.sizes().begin(), p.weight.sizes().end());
  row_shape[0] = -1;
  const torch::Tensor ids =
      train::TensorOverArray(p.ids_handle.result()).reshape({1, -1}).to(torch::kInt64);
  const torch::Tensor values = train::TensorOverArray(p.handle.result())
                                   .to(p.weight.device(), torch::kFloat32)
                                   .reshape(row_shape)
                                   .div(collectives::Size());
  return torch::sparse_coo_tensor(ids.to(p.weight.device()), values, p.weight.sizes());
}

void DistributedOptimizer::zero_grad() { inner_->zero_grad(); }

void DistributedOptimizer::step() {
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p->submitted) Submit(*p, torch::zeros_like(p->weight));
  }
  for (auto& p : params_) {
    p->handle.Wait();
    p->submitted = false;
    if (p->rows) {  // the average of every rank's rows, as a sparse gradient
      const torch::Tensor rows = GatheredRows(*p);
      // No rank touched the table: no gradient, which torch's optimizers skip (an empty sparse
      // one breaks LibTorch's Adagrad).
      p->weight.mutable_grad() = rows._nnz() > 0 ? rows : torch::Tensor();
      continue;
    }
    torch::Tensor averaged = p->buffer.to(p->weight.device(), torch::kFloat32);
    // A sparse gradient is replaced by the dense average; a dense one is written in place.
    if (p->weight.grad().defined() && !p->weight.grad().is_sparse()) {
      p->weight.mutable_grad().copy_(averaged);
    } else {
      p->weight.mutable_grad() = averaged;
    }
  }
  inner_->step();
}

}  // namespace dtrain::train::horovod

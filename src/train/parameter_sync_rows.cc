// ParameterSync's row-sparse exchange (see "Sparse gradients" in parameter_sync.h): an
// embedding's sparse gradients leave as rows (KVStore::PushRows), and a forward's rows come back
// through WaitForRows (KVStore::PullRows). A dist_sync pull waits for the round its worker's push
// joined, so the rows pulled after a push hold that step's update.
#include <algorithm>
#include <string>

#include "dtrain/common/error.h"
#include "train/parameter_sync_parts.h"
#include "train/tensor_array.h"

namespace dtrain::train {

bool ParameterSync::KeepSparseGradient(Param& p, int replica, const torch::Tensor& grad) {
  // A dense pass of this step already arrived: the rest of it is summed dense.
  if (!p.rows_capable || !grad.is_sparse() || p.grads[replica].defined()) return false;
  const torch::Tensor& weight = p.weights[0];
  if (grad.sparse_dim() != 1 || !grad.sizes().equals(weight.sizes()) ||
      grad.scalar_type() != torch::kFloat32) {
    return false;
  }
  p.sparse_seen = true;
  p.sparse_grads.push_back(grad);
  return true;
}

bool ParameterSync::TravelsAsRows(const Param& p) const {
  // A step in which backward did not reach the table pushes no row (a zero gradient): with a
  // lazy update that changes no row, as a dense zero would have changed them all.
  return p.rows_capable && p.sparse_seen &&
         std::none_of(p.grads.begin(), p.grads.end(),
                      [](const torch::Tensor& g) { return g.defined(); });
}

void ParameterSync::IssueRows(Bucket& b, std::unique_lock<std::mutex>& lock) {
  Param& p = *params_[b.params[0]];
  std::vector<int64_t> rows;
  Array values(Shape{0}, DType::kFloat32);
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> ids;
    std::vector<torch::Tensor> parts;
    // Uncoalesced, as the embedding gives them: the store sums repeated rows.
    for (const auto& g : p.sparse_grads) {
      ids.push_back(g._indices()[0]);
      parts.push_back(g._values());
    }
    p.sparse_grads.clear();
    if (!ids.empty()) {
      const torch::Tensor all_ids = torch::cat(ids).to(torch::kInt64).contiguous();
      const torch::Tensor all_values = torch::cat(parts).contiguous();
      rows.assign(all_ids.data_ptr<int64_t>(), all_ids.data_ptr<int64_t>() + all_ids.numel());
      values = ArrayOverTensor(all_values, DType::kFloat32, nullptr);
    }
  }
  b.issued = true;
  b.finished = false;
  p.rows_stale = true;
  Operation op;
  {
    Unlocked unlocked(lock);
    op = kv_.PushRows(static_cast<Key>(b.key), std::move(rows), values, static_cast<int>(b.key));
  }
  b.op = op;
}

void ParameterSync::PullIfRowsStale(Param& p, std::unique_lock<std::mutex>& lock) {
  if (!p.rows_stale) return;
  Operation pull = StartPull(*buckets_[p.bucket]);
  {
    Unlocked unlocked(lock);
    pull.Wait();
  }
  p.rows_stale = false;
}

void ParameterSync::WaitForRows(size_t index, const torch::Tensor& ids) {
  std::unique_lock<std::mutex> lock(mutex_);
  ThrowIfHookFailed();
  if (index >= params_.size()) {
    throw InvalidArgument("parameter index " + std::to_string(index) + " out of range (" +
                          std::to_string(params_.size()) + " parameters)");
  }
  Param& p = *params_[index];
  Finish(*buckets_[p.bucket], lock);
  if (!p.rows_stale) return;
  if (!ids.defined() || ids.is_floating_point() || ids.is_complex()) {
    throw InvalidArgument("the rows of parameter " + std::to_string(index) +
                          " are asked for by integer ids");
  }
  torch::Tensor unique;
  {
    torch::NoGradGuard no_grad;
    unique = std::get<0>(torch::_unique(ids.reshape(-1).to(torch::kCPU, torch::kInt64)));
  }
  if (unique.numel() == 0) return;
  // An id outside the table is the store's InvalidArgument (KVStore::PullRows checks each).
  std::vector<int64_t> rows(unique.data_ptr<int64_t>(),
                            unique.data_ptr<int64_t>() + unique.numel());
  std::vector<int64_t> shape(p.weights[0].sizes().begin(), p.weights[0].sizes().end());
  shape[0] = unique.numel();
  const torch::Tensor pulled = torch::empty(shape, torch::kFloat32);
  {
    Unlocked unlocked(lock);
    kv_.PullRows(static_cast<Key>(p.bucket), std::move(rows),
                 ArrayOverTensor(pulled, DType::kFloat32, nullptr))
        .Wait();
  }
  torch::NoGradGuard no_grad;
  for (auto& w : p.weights) w.detach().index_copy_(0, unique, pulled);
}

}  // namespace dtrain::train

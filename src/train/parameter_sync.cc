#include "dtrain/train/parameter_sync.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "common/logging.h"
#include "cuda/cuda.h"
#include "dtrain/common/error.h"
#include "optim/optimizer.h"
#include "report/reporter.h"
#include "report/timeline.h"
#include "train/parameter_sync_parts.h"
#include "train/tensor_array.h"
#include "train/tensor_dtype.h"
#include "train/torch_cuda.h"

namespace dtrain::train {

namespace {

bool Supported(const torch::Tensor& t) {
  return t.defined() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() &&
         (t.device().is_cpu() || t.device().is_cuda());
}

// Parameters the optimizers update in float32 master weights (MXNet's multi_precision).
bool HalfPrecision(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat16 || t.scalar_type() == torch::kBFloat16;
}

// Why a replica's parameter cannot be trained, or "" if it can.
std::string Unsupported(const torch::Tensor& t, const torch::Tensor& first) {
  if (!t.defined()) return "is undefined";
  if (t.scalar_type() != torch::kFloat32 && !HalfPrecision(t)) {
    const auto dtype = DTypeOf(t.scalar_type());
    return "is " + std::string(dtype ? DTypeName(*dtype) : c10::toString(t.scalar_type())) +
           ": the trainer trains float32 parameters, and float16 and bfloat16 ones through float32 "
           "master weights";
  }
  if (!t.is_contiguous()) return "is not contiguous";
  if (!(t.device().is_cpu() || t.device().is_cuda())) {
    return "is on " + t.device().str() + ", not the CPU or a CUDA device";
  }
  if (!t.sizes().equals(first.sizes()) || t.scalar_type() != first.scalar_type()) {
    return "differs from replica 0's in shape or dtype";
  }
  return "";
}

// An Array over a float32 tensor's memory, on the host or on a CUDA device (with the stream torch
// queues that device's work on now, so that the store's copies wait for the work that wrote it);
// the Array keeps the tensor alive.
Array ArrayOf(const torch::Tensor& t) {
  if (!Supported(t)) {
    throw InvalidArgument("the trainer handles contiguous float32 CPU or CUDA tensors only");
  }
  return ArrayOverTensor(t, DType::kFloat32, t.is_cuda() ? CurrentCudaStream(t.device()) : nullptr);
}

std::span<float> Floats(const torch::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
}

// A flat bucket's float32 buffer, on the device of the parameters it carries.
torch::Tensor Flat(int64_t numel, const torch::Device& device) {
  return torch::empty({numel}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
}

bool IsSync(const std::string& type) { return type.find("async") == std::string::npos; }

// The first byte of a saved optimizer state: whose state follows.
constexpr char kLocalState = 'L';
constexpr char kStoreState = 'S';

}  // namespace

bool DefaultUpdateOnKVStore(const std::string& store_type, bool cuda_parameters) {
  const bool local = store_type == "local" || store_type == "device";
  return !(local && cuda_parameters);
}

ParameterSync::ParameterSync(std::vector<std::vector<torch::Tensor>> replicas, KVStore& kv,
                             TrainerOptions options)
    : kv_(kv), options_(std::move(options)) {
  if (replicas.empty()) throw InvalidArgument("the trainer needs at least one replica");
  if (options_.batch_size < 0) {
    throw InvalidArgument("batch size must be at least 1 (or 0: learnt from the first step), got " +
                          std::to_string(options_.batch_size));
  }
  if (options_.backward_passes_per_step < 1) {
    throw InvalidArgument("backward_passes_per_step must be at least 1, got " +
                          std::to_string(options_.backward_passes_per_step));
  }
  sync_ = IsSync(kv_.type());
  if (!sync_ && !options_.update_on_kvstore) {
    throw InvalidArgument(
        "dist_async needs update_on_kvstore: the servers must apply each push as it arrives");
  }
  if (kv_.rejoined() && !options_.update_on_kvstore) {
    throw InvalidArgument(
        "this worker replaces a lost one, which needs the optimizer on the servers "
        "(update_on_kvstore): workers that update their own weights keep them nowhere a "
        "replacement can fetch them");
  }
  CreateOptimizer(options_.optimizer);  // validates now, whenever and wherever it will run
  if (options_.fuse_below_bytes < 0) options_.fuse_below_bytes = 0;

  num_replicas_ = replicas.size();
  const auto& first = replicas[0];
  for (size_t i = 0; i < first.size(); ++i) {
    auto p = std::make_unique<Param>();
    p->index = i;
    p->numel = first[i].numel();
    p->grads.resize(num_replicas_);
    p->arrived.assign(num_replicas_, 0);
    params_.push_back(std::move(p));
  }
  for (size_t r = 0; r < num_replicas_; ++r) {
    if (replicas[r].size() != params_.size()) {
      throw InvalidArgument("replica " + std::to_string(r) + " has " +
                            std::to_string(replicas[r].size()) + " parameters, replica 0 has " +
                            std::to_string(params_.size()));
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      const torch::Tensor& t = replicas[r][i];
      if (const std::string why = Unsupported(t, first[i]); !why.empty()) {
        throw InvalidArgument("parameter " + std::to_string(i) + " of replica " +
                              std::to_string(r) + " " + why);
      }
      if (t.device().is_cuda() && cuda::DeviceCount() == 0) {
        throw InvalidArgument("parameter " + std::to_string(i) + " of replica " +
                              std::to_string(r) + " is a CUDA tensor, but " + cuda::Unavailable());
      }
      params_[i]->weights.push_back(t);
    }
  }
  ReplicateFromFirst();
  PlanBuckets();
  const bool store_trains = options_.update_on_kvstore && kv_.type().rfind("dist", 0) == 0;
  for (auto& p : params_) {
    const torch::Tensor& w = p->weights[0];
    p->rows_capable = store_trains && !buckets_[p->bucket]->flat && w.dim() >= 2 &&
                      std::all_of(p->weights.begin(), p->weights.end(),
                                  [](const torch::Tensor& t) { return t.device().is_cpu(); });
  }

  // Rank 0's initial weights become everyone's.
  std::vector<Key> keys;
  std::vector<Array> initial;
  for (auto& b : buckets_) {
    keys.push_back(static_cast<Key>(b->key));
    initial.push_back(ArrayOf(b->flat ? b->weights : params_[b->params[0]]->weights[0]));
  }
  kv_.Init(keys, initial);
  PullWeights();
  if (options_.batch_size > 0) SetUpOptimizer(options_.batch_size);

  for (size_t r = 0; r < num_replicas_; ++r) {
    for (auto& p : params_) {
      const size_t index = p->index;
      const int replica = static_cast<int>(r);
      p->hooks.push_back(p->weights[r].register_hook(
          [this, index, replica](torch::Tensor grad) { OnGradient(index, replica, grad); }));
    }
  }
}

ParameterSync::~ParameterSync() {
  // Every exchange in flight ends before the hooks and the buffers go, whatever failed before
  // (WaitAll would stop at a failure kept from a hook).
  {
    std::unique_lock<std::mutex> lock(mutex_);
    for (auto& b : buckets_) {
      try {
        Finish(*b, lock, /*timed=*/false);
      } catch (const std::exception& e) {
        DTRAIN_LOG(kWarning) << "trainer: " << e.what();
      }
    }
  }
  // The networks outlive this sync (a Trainer made again on them: elastic jobs, a new store):
  // their next backward must not call into it.
  for (auto& p : params_) {
    for (size_t r = 0; r < p->hooks.size(); ++r) p->weights[r].remove_hook(p->hooks[r]);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ReportProgress(/*final=*/true);
}

void ParameterSync::PlanBuckets() {
  // Backward produces gradients roughly last layer first: fill buckets in that order so a bucket
  // is complete early.
  // With gradient compression that spares small keys, parameters the store would spare are fused
  // only into buckets it spares too, and the ones it compresses travel alone: fusing must not
  // change what is compressed.
  const CompressionSpec gc = kv_.gradient_compression();
  const int64_t spared_below = gc.enabled() ? gc.min_elements : 0;
  int64_t bucket_numel = options_.bucket_bytes / static_cast<int64_t>(sizeof(float));
  if (spared_below > 0) bucket_numel = std::min(bucket_numel, spared_below - 1);
  Bucket* open = nullptr;
  for (size_t n = params_.size(); n-- > 0;) {
    Param& p = *params_[n];
    const int64_t bytes = p.numel * static_cast<int64_t>(sizeof(float));
    const bool small =
        bytes < options_.fuse_below_bytes && (spared_below == 0 || p.numel < spared_below);
    if (!small || open == nullptr || open->numel + p.numel > bucket_numel) {
      buckets_.push_back(std::make_unique<Bucket>());
      buckets_.back()->key = buckets_.size() - 1;
      open = small ? buckets_.back().get() : nullptr;
    }
    Bucket& b = *buckets_.back();
    p.bucket = b.key;
    p.offset = b.numel;
    b.numel += p.numel;
    b.params.push_back(n);
  }
  for (auto& b : buckets_) {
    const auto& replicas = params_[b->params[0]]->weights;
    const torch::Tensor& first = replicas[0];
    b->flat = b->params.size() > 1 || HalfPrecision(first);
    b->pending = static_cast<int>(b->params.size() * num_replicas_);
    if (b->flat) {
      torch::NoGradGuard no_grad;
      for (size_t r = 0; r < num_replicas_; ++r) {
        b->grads.push_back(Flat(b->numel, replicas[r].device()));
      }
      b->weights = Flat(b->numel, first.device());
      Gather(*b);
    }
    if (!options_.update_on_kvstore) {
      if (first.device().is_cuda()) {
        b->summed_on_device = b->flat ? Flat(b->numel, first.device()) : torch::empty_like(first);
        b->summed = ArrayOf(b->summed_on_device);
      } else {
        b->summed = b->flat ? Array(Shape{b->numel})
                            : Array(Shape(first.sizes().begin(), first.sizes().end()));
      }
    }
  }
}

void ParameterSync::SetUpOptimizer(int64_t batch_size) {
  // Gradients arrive as sums over the batch; the optimizer turns them into a mean.
  OptimizerSpec spec = options_.optimizer;
  const double workers = sync_ ? kv_.num_workers() : 1;
  const double user_rescale = spec.params.count("rescale_grad") ? spec.params["rescale_grad"] : 1.0;
  spec.params["rescale_grad"] = user_rescale / (static_cast<double>(batch_size) * workers);
  if (options_.update_on_kvstore) {
    kv_.SetOptimizer(spec);
    if (pending_learning_rate_ >= 0) SetStoreLearningRate(pending_learning_rate_);
  } else {
    local_optimizer_ = CreateOptimizer(spec);
    if (pending_learning_rate_ >= 0) local_optimizer_->set_learning_rate(pending_learning_rate_);
  }
  options_.optimizer = spec;
  options_.batch_size = batch_size;
  optimizer_ready_ = true;
  if (!pending_state_.empty()) LoadOptimizerState(std::exchange(pending_state_, std::string()));
}

void ParameterSync::Gather(const Bucket& b) {
  torch::NoGradGuard no_grad;
  for (size_t i : b.params) {
    const Param& p = *params_[i];
    b.weights.narrow(0, p.offset, p.numel).copy_(p.weights[0].detach().reshape(-1));
  }
}

void ParameterSync::Scatter(const Bucket& b) {
  torch::NoGradGuard no_grad;
  for (size_t i : b.params) {
    const Param& p = *params_[i];
    const torch::Tensor slice = b.weights.narrow(0, p.offset, p.numel);
    for (const auto& w : p.weights) w.detach().view(-1).copy_(slice);
  }
}

void ParameterSync::ReplicateFromFirst() {
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    for (size_t r = 1; r < p->weights.size(); ++r) p->weights[r].copy_(p->weights[0]);
  }
  // A flat bucket's weights follow replica 0 too.
  for (auto& b : buckets_) {
    if (b->flat) Gather(*b);
  }
}

void ParameterSync::OnGradient(size_t index, int replica, const torch::Tensor& grad) {
  // Runs inside autograd, which would turn an exception into a generic one far from its cause:
  // a failure (a peer died while a bucket was still in flight) is kept for the training thread.
  std::unique_lock<std::mutex> lock(mutex_);
  if (hook_error_) return;
  try {
    TakeGradient(index, replica, grad, lock);
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    hook_error_ = std::current_exception();
  }
}

void ParameterSync::ThrowIfHookFailed() {
  if (hook_error_) std::rethrow_exception(hook_error_);
}

void ParameterSync::TakeGradient(size_t index, int replica, const torch::Tensor& grad,
                                 std::unique_lock<std::mutex>& lock) {
  Param& p = *params_[index];
  Bucket& b = *buckets_[p.bucket];
  // The flat buffer may still be read by last step's exchange if nothing waited for it. (Finish
  // may let go of the lock: what follows reads the counts after it.)
  if (b.flat) Finish(b, lock);
  // Autograd calls the hook once per backward (or autograd.grad) that reaches the parameter, with
  // its whole gradient: a call beyond the step's passes is a gradient the exchange would miss,
  // which must not pass in silence.
  if (b.issued || p.arrived[replica] >= options_.backward_passes_per_step) {
    throw InvalidArgument(
        "parameter " + std::to_string(index) + " got its gradient " +
        std::to_string(p.arrived[replica] + 1) + " since the last step, but the trainer sums " +
        std::to_string(options_.backward_passes_per_step) +
        " a step (backward_passes_per_step). Every backward or autograd.grad that reaches a "
        "parameter counts: call step() after each backward, set backward_passes_per_step to the "
        "passes a step sums, or keep other passes off these parameters (requires_grad_(False) "
        "while another model trains through them; use_reentrant=False for checkpointing)");
  }
  const bool first_pass = p.arrived[replica] == 0;
  // An embedding's sparse gradient (nn::Embedding with sparse(true)) travels as rows where it
  // can, and dense otherwise, as Horovod's sparse_as_dense: the stores sum dense values, and the
  // sum of sparse gradients is the sum of their dense forms (repeated rows add up).
  const bool kept = !b.flat && KeepSparseGradient(p, replica, grad);  // IssueRows sends it
  if (!kept) {
    const torch::Tensor dense = grad.is_sparse() ? grad.to_dense() : grad;
    if (b.flat) {
      torch::NoGradGuard no_grad;
      torch::Tensor slice = b.grads[replica].narrow(0, p.offset, p.numel);
      if (first_pass) {
        slice.copy_(dense.reshape(-1));
      } else {
        slice.add_(dense.reshape(-1));
      }
    } else if (!p.grads[replica].defined()) {  // the first dense pass
      p.grads[replica] = dense.contiguous();
    } else {
      // Out of place: the first pass's tensor is the one autograd keeps as .grad.
      torch::NoGradGuard no_grad;
      p.grads[replica] = p.grads[replica].add(dense);
    }
  }
  if (++p.arrived[replica] < options_.backward_passes_per_step) return;
  if (--b.pending == 0 && options_.overlap && optimizer_ready_) Issue(b, lock);
}

void ParameterSync::Issue(Bucket& b, std::unique_lock<std::mutex>& lock) {
  if (b.flat) Finish(b, lock);
  if (b.summed_on_device.defined()) b.summed = ArrayOf(b.summed_on_device);
  std::vector<Array> grads;
  std::vector<Array> outs;
  if (b.flat) {
    for (size_t i : b.params) {  // parameters this backward did not reach contribute zeros
      const Param& p = *params_[i];
      for (size_t r = 0; r < num_replicas_; ++r) {
        if (!p.arrived[r]) b.grads[r].narrow(0, p.offset, p.numel).zero_();
      }
    }
    for (const auto& g : b.grads) grads.push_back(ArrayOf(g));
    outs.push_back(options_.update_on_kvstore ? ArrayOf(b.weights) : b.summed);
  } else {
    Param& p = *params_[b.params[0]];
    if (TravelsAsRows(p)) {
      IssueRows(b, lock);
      return;
    }
    if (!p.sparse_grads.empty()) {  // a step that mixed sparse and dense gradients: all dense
      torch::NoGradGuard no_grad;
      torch::Tensor& g = p.grads[0];
      for (const auto& s : p.sparse_grads) g = g.defined() ? g.add(s.to_dense()) : s.to_dense();
      p.sparse_grads.clear();
    }
    for (auto& g : p.grads) {
      if (!g.defined()) g = torch::zeros_like(p.weights[0]);
      grads.push_back(ArrayOf(g));
    }
    if (options_.update_on_kvstore) {
      for (auto& w : p.weights) outs.push_back(ArrayOf(w));
    } else {
      outs.push_back(b.summed);
    }
    for (auto& g : p.grads) g = torch::Tensor();
  }
  b.issued = true;
  b.finished = false;
  // The next forward needs the parameters nearest the input first, and buckets are numbered in
  // backward order (PlanBuckets), so the last bucket is the most urgent (MXNet's -index).
  Operation op;
  {
    Unlocked unlocked(lock);
    op = kv_.PushPull(static_cast<Key>(b.key), std::move(grads), std::move(outs),
                      static_cast<int>(b.key));
  }
  b.op = op;
}

void ParameterSync::Finish(Bucket& b, std::unique_lock<std::mutex>& lock, bool timed) {
  if (b.finished) return;
  Operation op = b.op;
  const auto waited_from = std::chrono::steady_clock::now();
  {
    Unlocked unlocked(lock);
    op.Wait();
  }
  if (timed) {
    wait_s_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_from).count();
  }
  if (b.finished) return;
  torch::NoGradGuard no_grad;
  Param& first = *params_[b.params[0]];
  if (local_optimizer_) {
    // Replica 0's weights (a flat bucket's own) are updated where they are, as MXNet's
    // updater runs where the weights are, then copied to the other replicas below.
    const torch::Tensor& weights = b.flat ? b.weights : first.weights[0];
    if (weights.is_cuda()) {
      // Queued on torch's current stream, before those copies and the next forward: nothing here
      // waits for the GPU.
      local_optimizer_->UpdateOnDevice(b.key, ArrayOf(weights), b.summed);
    } else {
      local_optimizer_->Update(b.key, Floats(weights), b.summed.floats());
    }
  }
  if (b.flat) {
    Scatter(b);
  } else if (local_optimizer_) {
    for (size_t r = 1; r < first.weights.size(); ++r) first.weights[r].copy_(first.weights[0]);
  }
  b.finished = true;
}

void ParameterSync::WaitFor(size_t index) { WaitFor(std::span<const size_t>(&index, 1)); }

void ParameterSync::WaitFor(std::span<const size_t> indexes) {
  timeline::Span span(
      "wait_weights", "train",
      timeline::Enabled() ? timeline::Args().Int("step", steps_) : timeline::Args());
  std::unique_lock<std::mutex> lock(mutex_);
  ThrowIfHookFailed();
  for (size_t i : indexes) {
    if (i >= params_.size()) {
      throw InvalidArgument("parameter index " + std::to_string(i) + " out of range (" +
                            std::to_string(params_.size()) + " parameters)");
    }
    Finish(*buckets_[params_[i]->bucket], lock);
    PullIfRowsStale(*params_[i], lock);
  }
}

void ParameterSync::Step(int64_t batch_size) {
  timeline::Span span(
      "step", "train",
      timeline::Enabled() ? timeline::Args().Int("step", steps_) : timeline::Args());
  if (!optimizer_ready_) {
    if (batch_size < 1) {
      throw InvalidArgument("step of a batch of " + std::to_string(batch_size) +
                            " samples: the batch size must be at least 1");
    }
    SetUpOptimizer(batch_size);
  } else if (batch_size != options_.batch_size) {
    throw InvalidArgument("step of a batch of " + std::to_string(batch_size) +
                          " samples, but the trainer was set up for " +
                          std::to_string(options_.batch_size) +
                          " (gradients leave during backward; drop the last partial batch)");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  ThrowIfHookFailed();
  for (auto& b : buckets_) {
    if (!b->issued) Issue(*b, lock);
  }
  for (auto& b : buckets_) {
    b->issued = false;
    b->pending = static_cast<int>(b->params.size() * num_replicas_);
  }
  for (auto& p : params_) {
    std::fill(p->arrived.begin(), p->arrived.end(), 0);
    // Gradients are written fresh by each backward (Gluon's grad_req "write").
    for (auto& w : p->weights) w.mutable_grad() = torch::Tensor();
  }
  if (!options_.overlap) {
    for (auto& b : buckets_) Finish(*b, lock);
  }
  const auto now = std::chrono::steady_clock::now();
  if (!paused_) {
    active_s_ += std::chrono::duration<double>(now - last_step_end_).count();
    ++timed_steps_;
    timed_samples_ += batch_size;
  }
  paused_ = false;
  last_step_end_ = now;
  ++steps_;
  samples_ += batch_size;
  ReportProgress(/*final=*/false);
}

void ParameterSync::ReportProgress(bool final) {
  if (!report::Enabled() || steps_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double window = std::chrono::duration<double>(now - last_report_).count();
  if (!final && reported_steps_ > 0 && window < 1.0) return;
  nlohmann::json record = {
      {"kind", final ? "summary" : "progress"}, {"steps", steps_},       {"samples", samples_},
      {"timed_samples", timed_samples_},        {"active_s", active_s_}, {"wait_s", wait_s_}};
  // The rates over the wall time since the last report, as the progress lines measure them; none
  // for a window without a timed step (only evaluation or saving in it).
  const double active = active_s_ - reported_active_s_;
  if (reported_steps_ > 0 && active > 0) {
    record["steps_per_s"] = static_cast<double>(steps_ - reported_steps_) / window;
    record["samples_per_s"] = static_cast<double>(samples_ - reported_samples_) / window;
  }
  report::Send(std::move(record));
  last_report_ = now;
  reported_steps_ = steps_;
  reported_samples_ = samples_;
  reported_active_s_ = active_s_;
}

std::vector<std::pair<size_t, size_t>> ParameterSync::StaleGradients() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<size_t, size_t>> stale;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t r = 0; r < num_replicas_; ++r) {
      if (params_[i]->arrived[r] == 0) stale.emplace_back(i, r);
    }
  }
  return stale;
}

void ParameterSync::WaitAll() {
  std::unique_lock<std::mutex> lock(mutex_);
  ThrowIfHookFailed();
  paused_ = true;  // the caller does something else now (evaluates, saves)
  for (auto& b : buckets_) Finish(*b, lock, /*timed=*/false);
  for (auto& p : params_) PullIfRowsStale(*p, lock);
}

void ParameterSync::PullLatest() {
  WaitAll();  // nothing in flight: the pulls below are the only writers of the weights
  PullWeights();
}

Operation ParameterSync::StartPull(const Bucket& b) {
  std::vector<Array> outs;
  if (b.flat) {
    outs.push_back(ArrayOf(b.weights));
  } else {
    for (auto& w : params_[b.params[0]]->weights) outs.push_back(ArrayOf(w));
  }
  return kv_.Pull(static_cast<Key>(b.key), outs);
}

void ParameterSync::PullWeights() {
  std::vector<Operation> pulls;
  for (auto& b : buckets_) pulls.push_back(StartPull(*b));
  Operation::Combine(pulls).Wait();
  for (auto& b : buckets_) {
    if (b->flat) Scatter(*b);
  }
  for (auto& p : params_) p->rows_stale = false;
}

double ParameterSync::learning_rate() const {
  if (local_optimizer_) return local_optimizer_->learning_rate();
  if (pending_learning_rate_ >= 0) return pending_learning_rate_;
  return CreateOptimizer(options_.optimizer)->learning_rate();  // the spec's, or its default
}

void ParameterSync::set_learning_rate(double lr) {
  // Checked now by an optimizer of the same spec, whenever and wherever the change applies.
  CreateOptimizer(options_.optimizer)->set_learning_rate(lr);
  if (local_optimizer_) {
    // The last step's updates run here when their sums arrive, which may be after this call:
    // they finish first, at the old rate.
    WaitAll();
    local_optimizer_->set_learning_rate(lr);
    return;
  }
  pending_learning_rate_ = lr;
  if (options_.update_on_kvstore && optimizer_ready_) SetStoreLearningRate(lr);
}

void ParameterSync::SetStoreLearningRate(double lr) {
  // From the next step's update of every key, whichever runs first: in a sync store a key's
  // update number is its round, and this worker has pushed every key once a step (a replacement
  // joined after rounds_done of them). An async store's updates have no step: from the next one.
  const uint64_t next_step = static_cast<uint64_t>(kv_.rounds_done() + steps_) + 1;
  kv_.SetLearningRate(lr, sync_ ? next_step : 1);
}

std::string ParameterSync::SaveOptimizerState() {
  WaitAll();
  if (!optimizer_ready_) {
    throw InvalidArgument("the optimizer has no state before the first step");
  }
  if (local_optimizer_) return kLocalState + local_optimizer_->SaveState();
  return kStoreState + kv_.SaveOptimizerState();  // from the servers, for dist stores
}

void ParameterSync::LoadOptimizerState(const std::string& bytes) {
  const char want = options_.update_on_kvstore ? kStoreState : kLocalState;
  if (bytes.empty() || (bytes[0] != kLocalState && bytes[0] != kStoreState)) {
    throw InvalidArgument("not an optimizer state saved by a trainer");
  }
  if (bytes[0] != want) {
    throw InvalidArgument(std::string("the optimizer state was saved with update_on_kvstore=") +
                          (bytes[0] == kStoreState ? "true" : "false") +
                          "; load it into a trainer that updates on the same side");
  }
  if (!optimizer_ready_) {
    pending_state_ = bytes;  // restored as soon as the first step sets the optimizer up
    return;
  }
  WaitAll();
  const std::string state = bytes.substr(1);
  if (local_optimizer_) {
    local_optimizer_->LoadState(state);
    return;
  }
  // The store's optimizer: rank 0 restores it, and nobody pushes before it has.
  if (kv_.rank() == 0) kv_.LoadOptimizerState(state);
  kv_.Barrier();
}

}  // namespace dtrain::train

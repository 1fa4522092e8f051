#include "train/trainer.h"

#include <cstring>

#include "common/error.h"
#include "common/logging.h"

namespace dtrain::train {

namespace {

// An Array over a float32 CPU tensor's memory; the Array keeps the tensor alive.
Array ArrayOf(const torch::Tensor& t) {
  if (t.scalar_type() != torch::kFloat32 || !t.is_contiguous() || !t.device().is_cpu()) {
    throw InvalidArgument("the trainer handles contiguous float32 CPU tensors only");
  }
  Shape shape(t.sizes().begin(), t.sizes().end());
  return Array::Wrap(t.data_ptr(), std::move(shape), DType::kFloat32,
                     std::make_shared<torch::Tensor>(t));
}

std::span<float> Floats(const torch::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
}

bool IsSync(const std::string& type) { return type.find("async") == std::string::npos; }

constexpr const char* kOptimizerStateKey = "dtrain.optimizer_state";
constexpr const char* kStoreOptimizerStateKey = "dtrain.kvstore_optimizer_state";

}  // namespace

struct Trainer::Param {
  size_t index = 0;
  std::string name;
  std::vector<torch::Tensor> weights;  // one per replica
  std::vector<torch::Tensor> grads;    // this step's, per replica (unfused buckets)
  std::vector<char> arrived;           // per replica: this step's gradient is in
  size_t bucket = 0;
  int64_t offset = 0;  // in its bucket's flat buffers
  int64_t numel = 0;
};

// What travels under one key: one parameter (its tensors are sent and received in place) or
// several small ones (fused: copied into flat buffers on the way out and back).
struct Trainer::Bucket {
  size_t key = 0;
  std::vector<size_t> params;
  int64_t numel = 0;
  bool fused = false;
  std::vector<Array> grads;  // fused: per replica, flat
  Array weights;             // fused: flat weights (pull target, or what the optimizer updates)
  Array summed;              // optimizer here: the summed gradient
  int pending = 0;           // gradients still to arrive this step
  bool issued = false;       // this step's exchange has started
  bool finished = true;      // every replica holds the latest weights
  Operation op;
};

namespace {

Array Flat(int64_t numel) { return Array(Shape{numel}); }

}  // namespace

void Trainer::PlanBuckets() {
  // Backward produces gradients roughly last layer first: fill buckets in that order so a bucket
  // is complete early.
  Bucket* open = nullptr;
  for (size_t n = params_.size(); n-- > 0;) {
    Param& p = *params_[n];
    const int64_t bytes = p.numel * static_cast<int64_t>(sizeof(float));
    const bool small = bytes < options_.fuse_below_bytes;
    if (!small || open == nullptr ||
        (open->numel + p.numel) * static_cast<int64_t>(sizeof(float)) > options_.bucket_bytes) {
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
    b->fused = b->params.size() > 1;
    b->pending = static_cast<int>(b->params.size() * replicas_.size());
    if (b->fused) {
      for (size_t r = 0; r < replicas_.size(); ++r) b->grads.push_back(Flat(b->numel));
      b->weights = Flat(b->numel);
      for (size_t i : b->params) {
        const Param& p = *params_[i];
        std::memcpy(b->weights.floats().data() + p.offset, p.weights[0].data_ptr<float>(),
                    p.numel * sizeof(float));
      }
    }
    if (!options_.update_on_kvstore) {
      b->summed = b->fused ? Flat(b->numel) : Array(Shape(params_[b->params[0]]->weights[0].sizes().begin(), params_[b->params[0]]->weights[0].sizes().end()));
    }
  }
}

void Trainer::Scatter(const Bucket& b) {
  torch::NoGradGuard no_grad;
  for (size_t i : b.params) {
    const Param& p = *params_[i];
    for (const auto& w : p.weights) {
      std::memcpy(w.data_ptr<float>(), b.weights.floats().data() + p.offset,
                  p.numel * sizeof(float));
    }
  }
}

Trainer::Trainer(std::vector<std::shared_ptr<Network>> replicas, KVStore& kv,
                 TrainerOptions options)
    : replicas_(std::move(replicas)), kv_(kv), options_(std::move(options)) {
  if (replicas_.empty()) throw InvalidArgument("the trainer needs at least one network");
  if (options_.batch_size < 1) {
    throw InvalidArgument("batch size must be at least 1, got " +
                          std::to_string(options_.batch_size));
  }
  sync_ = IsSync(kv_.type());
  if (!sync_ && !options_.update_on_kvstore) {
    throw InvalidArgument(
        "dist_async needs update_on_kvstore: the servers must apply each push as it arrives");
  }
  // Gradients arrive as sums over the batch; the optimizer turns them into a mean.
  OptimizerSpec spec = options_.optimizer;
  const double workers = sync_ ? kv_.num_workers() : 1;
  const double user_rescale = spec.params.count("rescale_grad") ? spec.params["rescale_grad"] : 1.0;
  spec.params["rescale_grad"] = user_rescale / (static_cast<double>(options_.batch_size) * workers);
  std::unique_ptr<Optimizer> optimizer = CreateOptimizer(spec);  // validates, whichever side runs it
  options_.optimizer = spec;

  // Parameters in a fixed order (the same in every process).
  const auto named = replicas_[0]->named_parameters(/*recurse=*/true);
  index_of_.resize(replicas_.size());
  for (size_t i = 0; i < named.size(); ++i) {
    auto p = std::make_unique<Param>();
    p->index = i;
    p->name = named[i].key();
    p->numel = named[i].value().numel();
    params_.push_back(std::move(p));
  }
  for (size_t r = 0; r < replicas_.size(); ++r) {
    const auto list = replicas_[r]->parameters(/*recurse=*/true);
    if (list.size() != params_.size()) {
      throw InvalidArgument("replica " + std::to_string(r) + " has " + std::to_string(list.size()) +
                            " parameters, replica 0 has " + std::to_string(params_.size()));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].sizes().equals(named[i].value().sizes()) ||
          list[i].scalar_type() != torch::kFloat32 || !list[i].is_contiguous()) {
        throw InvalidArgument("replica " + std::to_string(r) + " differs from replica 0 at " +
                              params_[i]->name + " (or is not contiguous float32)");
      }
      params_[i]->weights.push_back(list[i]);
      index_of_[r][list[i].unsafeGetTensorImpl()] = i;
    }
  }
  for (auto& p : params_) {
    p->grads.resize(replicas_.size());
    p->arrived.assign(replicas_.size(), 0);
  }
  ReplicateFromFirst();
  if (options_.fuse_below_bytes <= 0) options_.fuse_below_bytes = 0;
  PlanBuckets();

  // Rank 0's initial weights become everyone's.
  std::vector<Key> keys;
  std::vector<Array> initial;
  for (auto& b : buckets_) {
    keys.push_back(static_cast<Key>(b->key));
    initial.push_back(b->fused ? b->weights : ArrayOf(params_[b->params[0]]->weights[0]));
  }
  kv_.Init(keys, initial);
  if (options_.update_on_kvstore) {
    kv_.SetOptimizer(spec);
  } else {
    local_optimizer_ = std::move(optimizer);
  }
  std::vector<Operation> pulls;
  for (auto& b : buckets_) {
    std::vector<Array> outs;
    if (b->fused) {
      outs.push_back(b->weights);
    } else {
      for (auto& w : params_[b->params[0]]->weights) outs.push_back(ArrayOf(w));
    }
    pulls.push_back(kv_.Pull(static_cast<Key>(b->key), outs));
  }
  Operation::Combine(pulls).Wait();
  for (auto& b : buckets_) {
    if (b->fused) Scatter(*b);
  }

  for (size_t r = 0; r < replicas_.size(); ++r) {
    for (auto& p : params_) {
      const size_t index = p->index;
      const int replica = static_cast<int>(r);
      p->weights[r].register_hook(
          [this, index, replica](torch::Tensor grad) { OnGradient(index, replica, grad); });
    }
    replicas_[r]->set_gate([this, replica = static_cast<int>(r)](torch::nn::Module& m) {
      GateModule(replica, m);
    });
  }
}

Trainer::~Trainer() {
  for (auto& r : replicas_) r->set_gate({});
  try {
    WaitAll();
  } catch (const std::exception& e) {
    DTRAIN_LOG(kWarning) << "trainer: " << e.what();
  }
}

void Trainer::ReplicateFromFirst() {
  torch::NoGradGuard no_grad;
  for (size_t r = 1; r < replicas_.size(); ++r) {
    for (auto& p : params_) p->weights[r].copy_(p->weights[0]);
    auto from = replicas_[0]->buffers(true);
    auto to = replicas_[r]->buffers(true);
    for (size_t b = 0; b < from.size() && b < to.size(); ++b) to[b].copy_(from[b]);
  }
}

void Trainer::OnGradient(size_t index, int replica, const torch::Tensor& grad) {
  std::unique_lock<std::mutex> lock(mutex_);
  Param& p = *params_[index];
  Bucket& b = *buckets_[p.bucket];
  if (b.issued || p.arrived[replica]) return;  // a parameter used twice: its hook fires per use
  if (b.fused) {
    // The flat buffer may still be read by last step's exchange if nothing gated it.
    Finish(b, lock);
    auto g = grad.contiguous();
    std::memcpy(b.grads[replica].floats().data() + p.offset, g.data_ptr<float>(),
                p.numel * sizeof(float));
  } else {
    p.grads[replica] = grad.contiguous();
  }
  p.arrived[replica] = 1;
  if (--b.pending == 0 && options_.overlap) Issue(b, lock);
}

void Trainer::Issue(Bucket& b, std::unique_lock<std::mutex>& lock) {
  if (b.fused) Finish(b, lock);
  std::vector<Array> grads;
  std::vector<Array> outs;
  if (b.fused) {
    for (size_t i : b.params) {  // parameters this backward did not reach contribute zeros
      const Param& p = *params_[i];
      for (size_t r = 0; r < replicas_.size(); ++r) {
        if (!p.arrived[r]) {
          std::memset(b.grads[r].floats().data() + p.offset, 0, p.numel * sizeof(float));
        }
      }
    }
    grads = b.grads;
    outs.push_back(options_.update_on_kvstore ? b.weights : b.summed);
  } else {
    Param& p = *params_[b.params[0]];
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
  // The exchange may complete at once (local store); no lock is needed by the store itself.
  lock.unlock();
  Operation op = kv_.PushPull(static_cast<Key>(b.key), std::move(grads), std::move(outs));
  lock.lock();
  b.op = op;
}

void Trainer::Finish(Bucket& b, std::unique_lock<std::mutex>& lock) {
  if (b.finished) return;
  Operation op = b.op;
  lock.unlock();
  op.Wait();
  lock.lock();
  if (b.finished) return;
  torch::NoGradGuard no_grad;
  if (b.fused) {
    if (local_optimizer_) local_optimizer_->Update(b.key, b.weights.floats(), b.summed.floats());
    Scatter(b);
  } else if (local_optimizer_) {
    Param& p = *params_[b.params[0]];
    local_optimizer_->Update(b.key, Floats(p.weights[0]), b.summed.floats());
    for (size_t r = 1; r < p.weights.size(); ++r) p.weights[r].copy_(p.weights[0]);
  }
  b.finished = true;
}

void Trainer::GateModule(int replica, torch::nn::Module& module) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (const auto& t : module.parameters(/*recurse=*/true)) {
    auto it = index_of_[replica].find(t.unsafeGetTensorImpl());
    if (it != index_of_[replica].end()) Finish(*buckets_[params_[it->second]->bucket], lock);
  }
}

void Trainer::Step(int64_t batch_size) {
  if (batch_size != options_.batch_size) {
    throw InvalidArgument("step of a batch of " + std::to_string(batch_size) +
                          " samples, but the trainer was set up for " +
                          std::to_string(options_.batch_size) +
                          " (gradients leave during backward; drop the last partial batch)");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto& b : buckets_) {
    if (!b->issued) Issue(*b, lock);
  }
  for (auto& b : buckets_) {
    b->issued = false;
    b->pending = static_cast<int>(b->params.size() * replicas_.size());
  }
  for (auto& p : params_) {
    std::fill(p->arrived.begin(), p->arrived.end(), 0);
    // Gradients are written fresh by each backward (Gluon's grad_req "write").
    for (auto& w : p->weights) w.mutable_grad() = torch::Tensor();
  }
  if (!options_.overlap) {
    for (auto& b : buckets_) Finish(*b, lock);
  }
}

void Trainer::WaitAll() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto& b : buckets_) Finish(*b, lock);
}

double Trainer::learning_rate() const {
  if (local_optimizer_) return local_optimizer_->learning_rate();
  auto it = options_.optimizer.params.find("learning_rate");
  return it == options_.optimizer.params.end() ? 0.0 : it->second;
}

void Trainer::set_learning_rate(double lr) {
  if (!local_optimizer_) {
    throw InvalidArgument(
        "the learning rate of an optimizer running in the store is set by its schedule "
        "(lr_scheduler); use update_on_kvstore=false to change it by hand");
  }
  local_optimizer_->set_learning_rate(lr);
}

void Trainer::Save(const std::string& path) {
  WaitAll();
  torch::serialize::OutputArchive archive;
  for (const auto& item : replicas_[0]->named_parameters(true)) archive.write(item.key(), item.value());
  for (const auto& item : replicas_[0]->named_buffers(true)) archive.write(item.key(), item.value(), true);
  if (local_optimizer_) {
    const std::string state = local_optimizer_->SaveState();
    auto bytes = torch::empty({static_cast<int64_t>(state.size())}, torch::kUInt8);
    std::memcpy(bytes.data_ptr(), state.data(), state.size());
    archive.write(kOptimizerStateKey, bytes, /*is_buffer=*/true);
  } else {
    const std::string state = kv_.SaveOptimizerState();  // from the servers, for dist stores
    auto bytes = torch::empty({static_cast<int64_t>(state.size())}, torch::kUInt8);
    std::memcpy(bytes.data_ptr(), state.data(), state.size());
    archive.write(kStoreOptimizerStateKey, bytes, /*is_buffer=*/true);
  }
  archive.save_to(path);
}

void Trainer::LoadOptimizerState(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::Tensor bytes;
  if (local_optimizer_) {
    if (!archive.try_read(kOptimizerStateKey, bytes, /*is_buffer=*/true)) return;
    bytes = bytes.contiguous();
    local_optimizer_->LoadState(std::string(static_cast<const char*>(bytes.data_ptr()),
                                            static_cast<size_t>(bytes.numel())));
    return;
  }
  // The store's optimizer: rank 0 restores it, and nobody pushes before it has.
  if (kv_.rank() == 0 && archive.try_read(kStoreOptimizerStateKey, bytes, /*is_buffer=*/true)) {
    bytes = bytes.contiguous();
    kv_.LoadOptimizerState(std::string(static_cast<const char*>(bytes.data_ptr()),
                                       static_cast<size_t>(bytes.numel())));
  }
  kv_.Barrier();
}

void Trainer::Load(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::NoGradGuard no_grad;
  for (auto& item : replicas_[0]->named_parameters(true)) archive.read(item.key(), item.value());
  for (auto& item : replicas_[0]->named_buffers(true)) archive.read(item.key(), item.value(), true);
  ReplicateFromFirst();
}

}  // namespace dtrain::train

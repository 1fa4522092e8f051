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

}  // namespace

struct Trainer::Param {
  size_t index = 0;
  std::string name;
  std::vector<torch::Tensor> weights;  // one per replica
  std::vector<torch::Tensor> grads;    // this step's, per replica
  int ready = 0;                       // replicas whose gradient arrived this step
  bool issued = false;                 // this step's exchange has been started
  bool finished = true;                // the weights hold the latest values
  Operation op;
  Array summed;  // the summed gradient, when the optimizer runs here
};

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

  // Parameters in a fixed order: the keys of the store.
  const auto named = replicas_[0]->named_parameters(/*recurse=*/true);
  index_of_.resize(replicas_.size());
  for (size_t i = 0; i < named.size(); ++i) {
    auto p = std::make_unique<Param>();
    p->index = i;
    p->name = named[i].key();
    params_.push_back(std::move(p));
  }
  for (size_t r = 0; r < replicas_.size(); ++r) {
    const auto list = replicas_[r]->parameters(/*recurse=*/true);
    if (list.size() != params_.size()) {
      throw InvalidArgument("replica " + std::to_string(r) + " has " + std::to_string(list.size()) +
                            " parameters, replica 0 has " + std::to_string(params_.size()));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].sizes().equals(named[i].value().sizes())) {
        throw InvalidArgument("replica " + std::to_string(r) + " differs from replica 0 at " +
                              params_[i]->name);
      }
      params_[i]->weights.push_back(list[i]);
      index_of_[r][list[i].unsafeGetTensorImpl()] = i;
    }
  }
  for (auto& p : params_) p->grads.resize(replicas_.size());
  ReplicateFromFirst();

  // Rank 0's initial weights become everyone's.
  std::vector<Key> keys;
  std::vector<Array> initial;
  for (auto& p : params_) {
    keys.push_back(static_cast<Key>(p->index));
    initial.push_back(ArrayOf(p->weights[0]));
  }
  kv_.Init(keys, initial);
  if (options_.update_on_kvstore) {
    kv_.SetOptimizer(spec);
  } else {
    local_optimizer_ = std::move(optimizer);
    for (auto& p : params_) p->summed = Array(Shape(p->weights[0].sizes().begin(), p->weights[0].sizes().end()));
  }
  std::vector<Operation> pulls;
  for (auto& p : params_) {
    std::vector<Array> outs;
    for (auto& w : p->weights) outs.push_back(ArrayOf(w));
    pulls.push_back(kv_.Pull(static_cast<Key>(p->index), outs));
  }
  Operation::Combine(pulls).Wait();

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
  if (p.issued) return;  // a parameter used twice in one graph: its hook fires once per use
  p.grads[replica] = grad.contiguous();
  if (++p.ready == static_cast<int>(replicas_.size()) && options_.overlap) Issue(p, lock);
}

void Trainer::Issue(Param& p, std::unique_lock<std::mutex>& lock) {
  std::vector<Array> grads;
  for (auto& g : p.grads) {
    if (!g.defined()) g = torch::zeros_like(p.weights[0]);  // not reached by this backward
    grads.push_back(ArrayOf(g));
  }
  std::vector<Array> outs;
  if (options_.update_on_kvstore) {
    for (auto& w : p.weights) outs.push_back(ArrayOf(w));
  } else {
    outs.push_back(p.summed);
  }
  p.issued = true;
  p.finished = false;
  for (auto& g : p.grads) g = torch::Tensor();
  // The exchange may complete at once (local store); no lock is needed by the store itself.
  lock.unlock();
  Operation op = kv_.PushPull(static_cast<Key>(p.index), std::move(grads), std::move(outs));
  lock.lock();
  p.op = op;
}

void Trainer::Finish(Param& p, std::unique_lock<std::mutex>& lock) {
  if (p.finished) return;
  Operation op = p.op;
  lock.unlock();
  op.Wait();
  lock.lock();
  if (p.finished) return;
  if (local_optimizer_) {
    torch::NoGradGuard no_grad;
    local_optimizer_->Update(p.index, Floats(p.weights[0]), p.summed.floats());
    for (size_t r = 1; r < p.weights.size(); ++r) p.weights[r].copy_(p.weights[0]);
  }
  p.finished = true;
}

void Trainer::GateModule(int replica, torch::nn::Module& module) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (const auto& t : module.parameters(/*recurse=*/true)) {
    auto it = index_of_[replica].find(t.unsafeGetTensorImpl());
    if (it != index_of_[replica].end()) Finish(*params_[it->second], lock);
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
  for (auto& p : params_) {
    if (!p->issued) Issue(*p, lock);
  }
  for (auto& p : params_) {
    p->issued = false;
    p->ready = 0;
    // Gradients are written fresh by each backward (Gluon's grad_req "write").
    for (auto& w : p->weights) w.mutable_grad() = torch::Tensor();
  }
  if (!options_.overlap) {
    for (auto& p : params_) Finish(*p, lock);
  }
}

void Trainer::WaitAll() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto& p : params_) Finish(*p, lock);
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
    DTRAIN_LOG(kWarning) << "the optimizer runs in the kvstore (update_on_kvstore); its state is "
                            "not saved with the model (use --update-on-kvstore false to keep it)";
  }
  archive.save_to(path);
}

void Trainer::LoadOptimizerState(const std::string& path) {
  if (!local_optimizer_) return;
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::Tensor bytes;
  if (!archive.try_read(kOptimizerStateKey, bytes, /*is_buffer=*/true)) return;
  bytes = bytes.contiguous();
  local_optimizer_->LoadState(
      std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel())));
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

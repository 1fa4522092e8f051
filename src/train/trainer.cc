#include "dtrain/train/trainer.h"

#include <cstring>

#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain::train {

namespace {

// Where Save keeps the optimizer's state (ParameterSync's bytes) in the checkpoint.
constexpr const char* kOptimizerStateKey = "dtrain.optimizer_state";

std::vector<torch::Tensor> Parameters(Network& net) { return net.parameters(/*recurse=*/true); }

}  // namespace

Trainer::Trainer(std::vector<std::shared_ptr<Network>> replicas, KVStore& kv,
                 TrainerOptions options)
    : replicas_(std::move(replicas)), kv_(kv) {
  if (replicas_.empty()) throw InvalidArgument("the trainer needs at least one network");
  if (options.batch_size < 1) {
    throw InvalidArgument("batch size must be at least 1, got " +
                          std::to_string(options.batch_size));
  }
  std::vector<std::vector<torch::Tensor>> params;
  for (auto& r : replicas_) params.push_back(Parameters(*r));
  index_of_.resize(replicas_.size());
  for (size_t r = 0; r < replicas_.size(); ++r) {
    for (size_t i = 0; i < params[r].size(); ++i) {
      index_of_[r][params[r][i].unsafeGetTensorImpl()] = i;
    }
  }
  ReplicateBuffers();
  sync_ = std::make_unique<ParameterSync>(std::move(params), kv_, std::move(options));
  for (size_t r = 0; r < replicas_.size(); ++r) {
    replicas_[r]->set_gate(
        [this, replica = static_cast<int>(r)](torch::nn::Module& m) { GateModule(replica, m); });
  }
}

Trainer::~Trainer() {
  for (auto& r : replicas_) r->set_gate({});
}

void Trainer::ReplicateBuffers() {
  torch::NoGradGuard no_grad;
  auto from = replicas_[0]->buffers(true);
  for (size_t r = 1; r < replicas_.size(); ++r) {
    auto to = replicas_[r]->buffers(true);
    for (size_t b = 0; b < from.size() && b < to.size(); ++b) to[b].copy_(from[b]);
  }
}

void Trainer::GateModule(int replica, torch::nn::Module& module) {
  std::vector<size_t> indexes;
  for (const auto& t : module.parameters(/*recurse=*/true)) {
    auto it = index_of_[replica].find(t.unsafeGetTensorImpl());
    if (it != index_of_[replica].end()) indexes.push_back(it->second);
  }
  sync_->WaitFor(indexes);
}

void Trainer::Step(int64_t batch_size) { sync_->Step(batch_size); }
void Trainer::WaitAll() { sync_->WaitAll(); }

void Trainer::PullLatest() { sync_->PullLatest(); }
double Trainer::learning_rate() const { return sync_->learning_rate(); }
void Trainer::set_learning_rate(double lr) { sync_->set_learning_rate(lr); }

void Trainer::Save(const std::string& path) {
  const std::string state = sync_->SaveOptimizerState();  // waits for every exchange
  torch::serialize::OutputArchive archive;
  // Saved from the host, so that a model trained on GPUs loads anywhere.
  for (const auto& item : replicas_[0]->named_parameters(true))
    archive.write(item.key(), item.value().detach().to(torch::kCPU));
  for (const auto& item : replicas_[0]->named_buffers(true))
    archive.write(item.key(), item.value().to(torch::kCPU), true);
  auto bytes = torch::empty({static_cast<int64_t>(state.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr(), state.data(), state.size());
  archive.write(kOptimizerStateKey, bytes, /*is_buffer=*/true);
  archive.save_to(path);
}

void Trainer::LoadOptimizerState(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::Tensor bytes;
  if (archive.try_read(kOptimizerStateKey, bytes, /*is_buffer=*/true)) {
    bytes = bytes.contiguous();
    sync_->LoadOptimizerState(std::string(static_cast<const char*>(bytes.data_ptr()),
                                          static_cast<size_t>(bytes.numel())));
  } else if (sync_->update_on_kvstore()) {
    kv_.Barrier();  // the workers that found a state wait here for rank 0 to restore it
  }
}

void LoadInto(torch::serialize::InputArchive& archive, torch::nn::Module& module) {
  // Copied into the tensors the module has (archive.read would swap in the saved ones: on the
  // saved device, and no longer the tensors the trainer syncs).
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(true)) {
    torch::Tensor saved;
    archive.read(item.key(), saved);
    item.value().copy_(saved);
  }
  for (auto& item : module.named_buffers(true)) {
    torch::Tensor saved;
    archive.read(item.key(), saved, /*is_buffer=*/true);
    item.value().copy_(saved);
  }
}

void Trainer::Load(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  LoadInto(archive, *replicas_[0]);
  sync_->ReplicateFromFirst();
  ReplicateBuffers();
}

}  // namespace dtrain::train

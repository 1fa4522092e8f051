// RunElastic and ElasticState (elastic.h): Horovod's elastic loop for the C++ Trainer.
#include "dtrain/train/elastic.h"

#include "collectives/collectives_internal.h"
#include "common/logging.h"
#include "dtrain/collectives/collectives.h"
#include "dtrain/common/error.h"
#include "dtrain/train/horovod.h"
#include "train/tensor_dtype.h"

namespace dtrain::train {
namespace {

// A membership can break while it forms (a worker dies during the rendezvous): this many failures
// in a row before training resumes, then the last one is thrown (Python's elastic.run has the
// same bound).
constexpr int kFailuresInARow = 5;

// Rank 0's `t` (a contiguous CPU tensor) into everyone's. Collectives move floats: other dtypes
// (a batch norm's int64 count) travel as float64, exact below 2^53.
void BroadcastTensor(const std::string& name, torch::Tensor& t) {
  torch::Tensor buffer = DTypeOf(t.scalar_type()) ? t : t.to(torch::kFloat64);
  collectives::Broadcast(name, horovod::ArrayView(buffer), 0);
  if (!buffer.is_same(t)) t.copy_(buffer);
}

}  // namespace

ElasticState::ElasticState(std::vector<std::shared_ptr<Network>> replicas)
    : replicas_(std::move(replicas)) {
  if (replicas_.empty()) throw InvalidArgument("ElasticState needs the trainer's networks");
  Save();
}

std::vector<torch::Tensor> ElasticState::Live() const {
  std::vector<torch::Tensor> live;
  for (const auto& p : replicas_[0]->parameters(true)) live.push_back(p);
  for (const auto& b : replicas_[0]->buffers(true)) live.push_back(b);
  return live;
}

void ElasticState::Save() {
  saved_.epoch = epoch;
  saved_.samples_done = samples_done;
  saved_.steps = steps;
  // First, as it waits for every exchange in flight: the weights copied below are then whole and
  // of the same step as the optimizer's state.
  if (trainer_) saved_.optimizer = trainer_->OptimizerState();
  torch::NoGradGuard no_grad;
  const auto live = Live();
  saved_.tensors.resize(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    // Copied into the same host tensor each time: a commit allocates nothing after the first.
    if (!saved_.tensors[i].defined()) {
      saved_.tensors[i] = torch::empty(live[i].sizes(), live[i].options().device(torch::kCPU));
    }
    saved_.tensors[i].copy_(live[i]);
  }
}

void ElasticState::Restore() {
  epoch = saved_.epoch;
  samples_done = saved_.samples_done;
  steps = saved_.steps;
  torch::NoGradGuard no_grad;
  const auto live = Live();
  for (size_t i = 0; i < live.size(); ++i) live[i].copy_(saved_.tensors[i]);
}

void ElasticState::Sync() {
  Array position(Shape{3}, DType::kFloat64);
  auto* p = static_cast<double*>(position.data());
  p[0] = static_cast<double>(saved_.epoch);
  p[1] = static_cast<double>(saved_.samples_done);
  p[2] = static_cast<double>(saved_.steps);
  collectives::Broadcast("elastic.position", position, 0);
  saved_.epoch = static_cast<int64_t>(p[0]);
  saved_.samples_done = static_cast<int64_t>(p[1]);
  saved_.steps = static_cast<int64_t>(p[2]);
  for (size_t i = 0; i < saved_.tensors.size(); ++i) {
    BroadcastTensor("elastic.tensor." + std::to_string(i), saved_.tensors[i]);
  }
  collectives::BroadcastBytes("elastic.optimizer", saved_.optimizer, 0);
}

void ElasticState::CheckHostUpdates() {
  Array update(Shape{1}, DType::kFloat64);
  auto* code = static_cast<double*>(update.data());
  *code = 0;
  if (collectives::Rank() == 0) {
    switch (collectives::ElasticHostsUpdate()) {
      case collectives::HostsUpdate::kNone:
        break;
      case collectives::HostsUpdate::kRemoved:
        *code = 1;
        break;
      case collectives::HostsUpdate::kAdded:
        *code = 2;
        break;
    }
  }
  collectives::Broadcast("elastic.hosts_updated", update, 0);
  if (*code != 0) throw HostsUpdatedInterrupt(/*skip_sync=*/*code == 1);
}

void ElasticState::Commit() {
  if (!trainer_)
    throw InvalidArgument("ElasticState::Commit is for RunElastic's training function");
  if (!collectives::IsElastic()) return;
  Save();
  CheckHostUpdates();
}

void RunElastic(ElasticState& state, const TrainerFactory& make_trainer,
                const ElasticTraining& train) {
  const bool elastic = collectives::IsElastic();
  bool skip_sync = false;
  int failures_in_a_row = 0;
  while (true) {
    std::unique_ptr<KVStore> kv;
    std::unique_ptr<Trainer> trainer;
    try {
      kv = KVStore::Create("horovod");  // in an elastic job, joins the next membership
      if (elastic && !skip_sync) state.Sync();
      state.Restore();
      trainer = make_trainer(*kv);
      if (!state.saved_.optimizer.empty()) trainer->RestoreOptimizerState(state.saved_.optimizer);
      state.trainer_ = trainer.get();
      failures_in_a_row = 0;
      train(*trainer, *kv, state);
      state.trainer_ = nullptr;
      return;
    } catch (const HostsUpdatedInterrupt& e) {
      skip_sync = e.skip_sync();
    } catch (const Error& e) {
      state.trainer_ = nullptr;
      const bool broken =
          dynamic_cast<const PeerError*>(&e) || dynamic_cast<const TimeoutError*>(&e);
      if (!elastic || !broken || ++failures_in_a_row == kFailuresInARow) throw;
      const int64_t redo = state.steps - state.saved_.steps;
      DTRAIN_LOG(kWarning) << "elastic: " << e.what() << "; rolling back " << redo
                           << " step(s) to the last commit and joining the next membership";
      collectives::NoteElasticRollback(redo);
      skip_sync = false;
    }
    state.trainer_ = nullptr;
    // The engine first: it fails what is still in flight, which the Trainer and the store then
    // stop waiting for.
    collectives::Shutdown();
    trainer.reset();
    kv.reset();
  }
}

}  // namespace dtrain::train

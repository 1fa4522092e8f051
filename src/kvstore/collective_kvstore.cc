#include "kvstore/collective_kvstore.h"

#include "collectives/collectives_internal.h"
#include "common/elementwise.h"
#include "compression/codec.h"
#include "dtrain/common/error.h"
#include "kvstore/array_checks.h"
#include "kvstore/key_names.h"
#include "kvstore/operation_state.h"
#include "report/timeline.h"

namespace dtrain {

struct CollectiveKVStore::Slot {
  explicit Slot(Array v) : value(std::move(v)), merged(value.shape(), value.dtype()) {}

  const Array value;   // the weight (or, without optimizer, the last summed push)
  const Array merged;  // this round's sum: local arrays, then allreduced in place
  std::mutex mutex;    // guards last_push
  std::shared_ptr<OperationState> last_push;  // merged is busy until this is done
};

namespace {

std::string CollectiveName(Key key) { return "kv." + std::to_string(key); }

}  // namespace

CollectiveKVStore::CollectiveKVStore(const Config& config) : timeout_(config.request_timeout) {
  collectives::Init();
}

// Pushes still running use the slots: let them finish (their errors are theirs to report).
CollectiveKVStore::~CollectiveKVStore() {
  try {
    WaitAll();
  } catch (const std::exception&) {
  }
}

int CollectiveKVStore::rank() const { return collectives::Rank(); }
int CollectiveKVStore::num_workers() const { return collectives::Size(); }

void CollectiveKVStore::Init(Key key, const Array& value) {
  CheckKey(key);
  CheckInitValue("Init", key, value);
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (slots_.count(key)) {
      throw InvalidArgument("key " + KeyLabel(key) + " is already initialised");
    }
  }
  auto slot = std::make_unique<Slot>(value.Clone());
  // Rank 0's value becomes everyone's, as the servers keep rank 0's in dist_sync.
  collectives::Broadcast("kv.init." + std::to_string(key), slot->value, 0);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!slots_.try_emplace(key, std::move(slot)).second) {
    throw InvalidArgument("key " + KeyLabel(key) + " is already initialised");
  }
}

CollectiveKVStore::Slot& CollectiveKVStore::Find(Key key, const char* call) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    throw InvalidArgument(std::string(call) + ": key " + KeyLabel(key) +
                          " was never initialised (call Init first)");
  }
  return *it->second;  // slots are never removed
}

Operation CollectiveKVStore::StartPush(Key key, Slot& slot, const std::vector<Array>& values,
                                       std::vector<Array> outs, const char* call, int priority) {
  CheckArrays(call, key, slot.value, values, "value");
  if (!outs.empty()) CheckArrays(call, key, slot.value, outs, "out");
  std::shared_ptr<Optimizer> optimizer;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    optimizer = optimizer_;
  }
  if (optimizer && slot.value.dtype() != DType::kFloat32) {
    throw InvalidArgument(std::string(call) + " of key " + KeyLabel(key) +
                          ": the optimizer updates float32 values only, the key holds " +
                          DescribeArray(slot.value));
  }
  auto op = std::make_shared<OperationState>(
      std::string(call) + " of key " + KeyLabel(key) + " (allreduce)", 1, timeout_);
  if (timeline::Enabled()) {
    op->WhenDone([name = outs.empty() ? "push" : "pushpull", key, bytes = slot.value.nbytes(),
                  begin = timeline::Now()] {
      timeline::Complete(name, "kvstore", begin, timeline::Now(),
                         timeline::Args().Str("key", KeyLabel(key)).Int("bytes", bytes));
    });
  }
  std::shared_ptr<OperationState> previous;
  {
    std::lock_guard<std::mutex> lock(slot.mutex);
    previous = slot.last_push;
    slot.last_push = op;
  }
  // The previous round of this key still owns `merged` until it is applied. (Its failure is that
  // round's to report; this round starts afresh.)
  if (previous) {
    try {
      previous->Wait();
    } catch (const Error&) {
    }
  }
  slot.merged.CopyFrom(values[0]);
  for (size_t i = 1; i < values.size(); ++i) {
    AddInto(slot.merged.data(), values[i].data(), slot.merged.size(), slot.merged.dtype());
  }
  const collectives::Handle handle = collectives::AllreduceAsync(
      CollectiveName(key), slot.merged, slot.merged, collectives::ReduceOp::kSum, priority);
  // Applied by the thread that ran the engine's round (its own, or a waiting caller's; one round
  // at a time) as soon as the sum is in: no hand-off to another thread
  // before the training thread, waiting on the operation, can go on.
  Slot* s = &slot;
  handle.OnDone([s, key, optimizer, op, outs = std::move(outs)](std::exception_ptr error) {
    if (!error) {
      try {
        if (optimizer) {
          optimizer->Update(static_cast<uint64_t>(key), s->value.floats(), s->merged.floats());
        } else {
          s->value.CopyFrom(s->merged);
        }
        for (const Array& out : outs) out.CopyFrom(s->value);
      } catch (...) {
        error = std::current_exception();
      }
    }
    op->PartDone(error);
  });
  return Operation(op);
}

Operation CollectiveKVStore::Push(Key key, std::vector<Array> values, int priority) {
  return StartPush(key, Find(key, "Push"), values, {}, "Push", priority);
}

Operation CollectiveKVStore::PushPull(Key key, std::vector<Array> values, std::vector<Array> outs,
                                      int priority) {
  return StartPush(key, Find(key, "PushPull"), values, std::move(outs), "PushPull", priority);
}

// A pull returns the value once this worker's pushes of the key are applied: it waits for the
// last one here (pulls of a key being pushed are rare: the Trainer uses PushPull).
Operation CollectiveKVStore::Pull(Key key, std::vector<Array> outs, int /*priority*/) {
  Slot& slot = Find(key, "Pull");
  CheckArrays("Pull", key, slot.value, outs, "out");
  auto op = std::make_shared<OperationState>("Pull of key " + KeyLabel(key), 1, timeout_);
  std::shared_ptr<OperationState> last_push;
  {
    std::lock_guard<std::mutex> lock(slot.mutex);
    last_push = slot.last_push;
  }
  try {
    if (last_push) last_push->Wait();
    for (const Array& out : outs) out.CopyFrom(slot.value);
    op->PartDone();
  } catch (...) {
    op->PartDone(std::current_exception());
  }
  return Operation(op);
}

void CollectiveKVStore::WaitAll() {
  std::vector<std::shared_ptr<OperationState>> pushes;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    for (auto& [key, slot] : slots_) {
      std::lock_guard<std::mutex> slot_lock(slot->mutex);
      if (slot->last_push) pushes.push_back(slot->last_push);
    }
  }
  for (const auto& p : pushes) p->Wait();
}

void CollectiveKVStore::Barrier() {
  WaitAll();
  ShareLoadedOptimizerState();
  collectives::Barrier();
}

// The Trainer restores the store's optimizer state on rank 0 only (a server's state is shared),
// then calls Barrier on every worker. Here every worker runs its own copy of the optimizer, so
// the barrier hands rank 0's restored state to the others. One small broadcast when nothing was
// loaded.
void CollectiveKVStore::ShareLoadedOptimizerState() {
  std::string state;
  if (rank() == 0) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    state.swap(loaded_state_);
  }
  collectives::BroadcastBytes("kv.optimizer_state", state, 0);
  if (rank() != 0 && !state.empty()) LoadOptimizerState(state);
}

void CollectiveKVStore::SetOptimizer(const OptimizerSpec& spec) {
  std::shared_ptr<Optimizer> optimizer = CreateOptimizer(spec);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  optimizer_ = std::move(optimizer);
}

void CollectiveKVStore::SetLearningRate(double learning_rate, uint64_t from_update) {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!optimizer_) throw InvalidArgument("this kvstore has no optimizer whose rate to set");
  optimizer_->set_learning_rate_from(from_update, learning_rate);
}

std::string CollectiveKVStore::SaveOptimizerState() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!optimizer_) throw InvalidArgument("this kvstore has no optimizer whose state to save");
  return optimizer_->SaveState();
}

void CollectiveKVStore::LoadOptimizerState(const std::string& state) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!optimizer_) throw InvalidArgument("set the optimizer before loading its state");
  optimizer_->LoadState(state);
  if (rank() == 0) loaded_state_ = state;
}

void CollectiveKVStore::SetGradientCompression(const std::map<std::string, std::string>& params) {
  const CompressionSpec spec = CompressionSpec::FromParams(params);  // bad parameters first
  if (!spec.enabled()) return;
  throw InvalidArgument(
      "the horovod kvstore does not take set_gradient_compression (" + spec.ToString() +
      "); allreduce mode sends float16 with DTRAIN_FP16_ALLREDUCE=1 (dtrain-train "
      "--fp16-allreduce, or DistributedOptimizer(..., compression=Compression.fp16))");
}

}  // namespace dtrain

#include "kvstore/collective_kvstore.h"

#include <cstring>

#include "common/error.h"
#include "kvstore/array_checks.h"

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
  completion_thread_ = std::thread([this] { CompletionLoop(); });
}

CollectiveKVStore::~CollectiveKVStore() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  completion_thread_.join();
}

int CollectiveKVStore::rank() const { return collectives::Rank(); }
int CollectiveKVStore::num_workers() const { return collectives::Size(); }

void CollectiveKVStore::Init(Key key, const Array& value) {
  if (!value.defined()) {
    throw InvalidArgument("Init of key " + std::to_string(key) + ": the value is undefined");
  }
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (slots_.count(key)) {
      throw InvalidArgument("key " + std::to_string(key) + " is already initialised");
    }
  }
  auto slot = std::make_unique<Slot>(value.Clone());
  // Rank 0's value becomes everyone's, as the servers keep rank 0's in dist_sync.
  collectives::Broadcast("kv.init." + std::to_string(key), slot->value, 0);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!slots_.try_emplace(key, std::move(slot)).second) {
    throw InvalidArgument("key " + std::to_string(key) + " is already initialised");
  }
}

CollectiveKVStore::Slot& CollectiveKVStore::Find(Key key, const char* call) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    throw InvalidArgument(std::string(call) + ": key " + std::to_string(key) +
                          " was never initialised (call Init first)");
  }
  return *it->second;  // slots are never removed
}

CollectiveKVStore::Task CollectiveKVStore::StartPush(Key key, Slot& slot,
                                                     const std::vector<Array>& values,
                                                     const char* call) {
  CheckArrays(call, key, slot.value, values, "value");
  std::shared_ptr<Optimizer> optimizer;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    optimizer = optimizer_;
  }
  if (optimizer && slot.value.dtype() != DType::kFloat32) {
    throw InvalidArgument(std::string(call) + " of key " + std::to_string(key) +
                          ": the optimizer updates float32 values only, the key holds " +
                          DescribeArray(slot.value));
  }
  auto op = std::make_shared<OperationState>(
      std::string(call) + " of key " + std::to_string(key) + " (allreduce)", 1, timeout_);
  std::shared_ptr<OperationState> previous;
  {
    std::lock_guard<std::mutex> lock(slot.mutex);
    previous = slot.last_push;
    slot.last_push = op;
  }
  // The previous round of this key still owns `merged` until it is applied.
  if (previous) previous->Wait();
  slot.merged.CopyFrom(values[0]);
  for (size_t i = 1; i < values.size(); ++i) {
    AddInto(slot.merged.data(), values[i].data(), slot.merged.size(), slot.merged.dtype());
  }
  Task task;
  task.collective = collectives::AllreduceAsync(CollectiveName(key), slot.merged, slot.merged,
                                                collectives::ReduceOp::kSum);
  task.has_collective = true;
  task.op = op;
  Slot* s = &slot;
  task.apply = [s, key, optimizer] {
    if (optimizer) {
      optimizer->Update(static_cast<uint64_t>(key), s->value.floats(), s->merged.floats());
    } else {
      s->value.CopyFrom(s->merged);
    }
  };
  return task;
}

Operation CollectiveKVStore::Push(Key key, std::vector<Array> values, int /*priority*/) {
  Slot& slot = Find(key, "Push");
  Task task = StartPush(key, slot, values, "Push");
  Operation result(task.op);
  Enqueue(std::move(task));
  return result;
}

Operation CollectiveKVStore::Pull(Key key, std::vector<Array> outs, int /*priority*/) {
  Slot& slot = Find(key, "Pull");
  CheckArrays("Pull", key, slot.value, outs, "out");
  Task task;
  task.op = std::make_shared<OperationState>("Pull of key " + std::to_string(key), 1, timeout_);
  Slot* s = &slot;
  task.apply = [s, outs = std::move(outs)] {
    for (const Array& out : outs) out.CopyFrom(s->value);
  };
  Operation result(task.op);
  Enqueue(std::move(task));
  return result;
}

Operation CollectiveKVStore::PushPull(Key key, std::vector<Array> values, std::vector<Array> outs,
                                      int /*priority*/) {
  Slot& slot = Find(key, "PushPull");
  CheckArrays("PushPull", key, slot.value, outs, "out");
  Task task = StartPush(key, slot, values, "PushPull");
  Slot* s = &slot;
  task.apply = [s, apply = std::move(task.apply), outs = std::move(outs)] {
    apply();
    for (const Array& out : outs) out.CopyFrom(s->value);
  };
  Operation result(task.op);
  Enqueue(std::move(task));
  return result;
}

void CollectiveKVStore::Enqueue(Task task) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(std::move(task));
  }
  queue_cv_.notify_all();
}

// Tasks complete in the order they were issued: a pull queued after a push of its key sees it.
void CollectiveKVStore::CompletionLoop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      if (task.has_collective) task.collective.Wait();
      if (task.apply) task.apply();
    } catch (...) {
      error = std::current_exception();
    }
    task.op->PartDone(error);
  }
}

void CollectiveKVStore::WaitAll() {
  // An empty task completes after everything queued before it.
  Task marker;
  marker.op = std::make_shared<OperationState>("WaitAll", 1, timeout_);
  Operation op(marker.op);
  Enqueue(std::move(marker));
  op.Wait();
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
  Array length(Shape{1}, DType::kFloat64);
  *static_cast<double*>(length.data()) = static_cast<double>(state.size());
  collectives::Broadcast("kv.optimizer_state.length", length, 0);
  const auto size = static_cast<size_t>(*static_cast<const double*>(length.data()));
  if (size == 0) return;
  Array bytes(Shape{static_cast<int64_t>((size + 3) / 4)}, DType::kFloat32);
  if (rank() == 0) std::memcpy(bytes.data(), state.data(), size);
  collectives::Broadcast("kv.optimizer_state", bytes, 0);
  if (rank() != 0) LoadOptimizerState(std::string(bytes.bytes(), size));
}

void CollectiveKVStore::SetOptimizer(const OptimizerSpec& spec) {
  std::shared_ptr<Optimizer> optimizer = CreateOptimizer(spec);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  optimizer_ = std::move(optimizer);
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

}  // namespace dtrain

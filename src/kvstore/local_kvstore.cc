#include "kvstore/local_kvstore.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/elementwise.h"
#include "cuda/cuda.h"
#include "dtrain/common/error.h"
#include "kvstore/array_checks.h"
#include "kvstore/key_names.h"

namespace dtrain {

struct LocalKVStore::Slot {
  explicit Slot(Array v)
      : layout(Array::Wrap(nullptr, v.shape(), v.dtype(), nullptr)), value(std::move(v)) {}

  const Array layout;  // the value's shape and dtype, without data: read unlocked
  std::mutex mutex;    // one push or pull of this key at a time
  Array value;         // on the host, or on the GPU of its last update
  Array merged;        // the summed gradient, when an optimizer needs it apart from the weight
  std::vector<std::vector<float>> residuals;  // per device, with gradient compression
};

namespace {

// What a push needs beyond matching arrays, checked before anything is written so that a refused
// push leaves the key as it was. (Every dtype can be summed; only float32 can be optimised.)
void CheckPushable(const char* call, Key key, const Array& value, const Optimizer* optimizer,
                   bool compressed) {
  if (optimizer != nullptr && value.dtype() != DType::kFloat32) {
    throw InvalidArgument(std::string(call) + " of key " + KeyLabel(key) +
                          ": the optimizer updates float32 values only, the key holds " +
                          DescribeArray(value));
  }
  if (compressed && value.dtype() != DType::kFloat32) {
    throw InvalidArgument(std::string(call) + " of key " + KeyLabel(key) +
                          ": gradient compression works on float32 values, the key holds " +
                          DescribeArray(value));
  }
}

// Whether a push of `values` is summed and applied (assigned, or the optimizer's update) on their
// GPU (DeviceUpdates::UpdatesOnDevice); `compressed`: the store's compression applies to them.
bool UpdatedOnDevice(const std::string& type, const std::vector<Array>& values,
                     const Optimizer* optimizer, bool compressed) {
  if (values.empty()) return false;
  const bool on_devices = std::all_of(values.begin(), values.end(), [&](const Array& a) {
    return a.defined() && a.on_device() &&
           (optimizer == nullptr || a.dtype() == DType::kFloat32);  // what optimizers update
  });
  if (!on_devices) return false;
  if (values.size() == 1) return true;
  return type == "device" && !compressed;
}

// `value` in the memory of `device` (a copy, waited for, unless it is there already).
Array MovedToDevice(const Array& value, int device) {
  if (value.on_device() && value.device() == device) return value;
  const Array host = value.on_device() ? cuda::ToHost(value) : value;
  return cuda::NewOnDevice(device, host.shape(), host.dtype(), host.data());
}

// `value` named as written by the work queued on `stream`.
Array OnStream(const Array& value, void* stream) {
  return Array::WrapDevice(value.data(), value.shape(), value.dtype(), value.device(), stream,
                           value.owner());
}

}  // namespace

LocalKVStore::LocalKVStore(std::string type, const Config& config)
    : type_(std::move(type)),
      reduction_threads_(std::max(1, config.reduction_threads)),
      bigarray_bound_(std::max<int64_t>(1, config.bigarray_bound)) {
  if (type_ != "local" && type_ != "device") {
    throw InvalidArgument("LocalKVStore serves the kvstore types \"local\" and \"device\", not \"" +
                          type_ + "\"");
  }
}

LocalKVStore::~LocalKVStore() = default;

void LocalKVStore::Init(Key key, const Array& value) {
  CheckKey(key);
  CheckInitValue("Init", key, value);
  // Copy outside the lock: a big value would hold up every other key meanwhile.
  auto slot = std::make_unique<Slot>(value.Clone());
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!slots_.try_emplace(key, std::move(slot)).second) {
    throw InvalidArgument("key " + KeyLabel(key) + " is already initialised");
  }
}

LocalKVStore::Slot& LocalKVStore::Find(Key key, const char* call,
                                       std::shared_ptr<Optimizer>* optimizer,
                                       CompressionSpec* compression) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (compression != nullptr) *compression = compression_;
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    throw InvalidArgument(std::string(call) + ": key " + KeyLabel(key) +
                          " was never initialised (call Init first)");
  }
  if (optimizer != nullptr) *optimizer = optimizer_;
  return *it->second;  // slots are never removed, so the reference outlives the lock
}

Operation LocalKVStore::Push(Key key, std::vector<Array> values, int /*priority*/) {
  std::shared_ptr<Optimizer> optimizer;
  CompressionSpec compression;
  Slot& slot = Find(key, "Push", &optimizer, &compression);
  pushed_.store(true, std::memory_order_relaxed);
  CheckArrays("Push", key, slot.layout, values, "value");
  const bool compress = compression.AppliesTo(slot.layout.size()) && values.size() > 1;
  CheckPushable("Push", key, slot.layout, optimizer.get(), compress);
  std::shared_lock<std::shared_mutex> updating(updates_);
  std::lock_guard<std::mutex> lock(slot.mutex);
  Apply(key, slot, values, optimizer.get(), compress ? &compression : nullptr);
  return Operation();
}

Operation LocalKVStore::PushPacked(Key key, const CompressionSpec& spec, std::vector<Array> packed,
                                   std::vector<Array> outs) {
  const char* call = outs.empty() ? "Push" : "PushPull";
  std::shared_ptr<Optimizer> optimizer;
  CompressionSpec compression;
  Slot& slot = Find(key, call, &optimizer, &compression);
  if (packed.empty()) {
    throw InvalidArgument(std::string(call) + " of key " + KeyLabel(key) +
                          ": no compressed values given");
  }
  for (const Array& p : packed) CheckPackedValue(call, key, slot.layout, spec, compression, p);
  if (!outs.empty()) CheckArrays(call, key, slot.layout, outs, "out");
  pushed_.store(true, std::memory_order_relaxed);
  std::shared_lock<std::shared_mutex> updating(updates_);
  std::lock_guard<std::mutex> lock(slot.mutex);
  Apply(key, slot, packed, optimizer.get(), &compression, /*packed=*/true);
  if (!outs.empty()) cuda::Copy(slot.value, outs);  // wherever each is
  return Operation();
}

Operation LocalKVStore::Pull(Key key, std::vector<Array> outs, int /*priority*/) {
  Slot& slot = Find(key, "Pull", nullptr);
  CheckArrays("Pull", key, slot.layout, outs, "out");
  std::lock_guard<std::mutex> lock(slot.mutex);
  cuda::Copy(slot.value, outs);  // wherever each is
  return Operation();
}

Operation LocalKVStore::PushPull(Key key, std::vector<Array> values, std::vector<Array> outs,
                                 int /*priority*/) {
  std::shared_ptr<Optimizer> optimizer;
  CompressionSpec compression;
  Slot& slot = Find(key, "PushPull", &optimizer, &compression);
  pushed_.store(true, std::memory_order_relaxed);
  CheckArrays("PushPull", key, slot.layout, values, "value");
  CheckArrays("PushPull", key, slot.layout, outs, "out");
  const bool compress = compression.AppliesTo(slot.layout.size()) && values.size() > 1;
  CheckPushable("PushPull", key, slot.layout, optimizer.get(), compress);
  // One lock for both halves: no other push of this key comes between them. `outs` may be the
  // very arrays of `values` (an in-place pushpull): the push has read them all before the pull
  // writes.
  std::shared_lock<std::shared_mutex> updating(updates_);
  std::lock_guard<std::mutex> lock(slot.mutex);
  Apply(key, slot, values, optimizer.get(), compress ? &compression : nullptr);
  cuda::Copy(slot.value, outs);  // wherever each is
  return Operation();
}

std::string LocalKVStore::SaveOptimizerState() {
  std::unique_lock<std::shared_mutex> no_updates(updates_);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!optimizer_) throw InvalidArgument("this kvstore has no optimizer whose state to save");
  return optimizer_->SaveState();
}

void LocalKVStore::LoadOptimizerState(const std::string& state) {
  std::unique_lock<std::shared_mutex> no_updates(updates_);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!optimizer_) throw InvalidArgument("set the optimizer before loading its state");
  optimizer_->LoadState(state);
}

void LocalKVStore::SetLearningRate(double learning_rate, uint64_t from_update) {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!optimizer_) throw InvalidArgument("this kvstore has no optimizer whose rate to set");
  optimizer_->set_learning_rate_from(from_update, learning_rate);
}

void LocalKVStore::SetOptimizer(const OptimizerSpec& spec) {
  std::shared_ptr<Optimizer> optimizer = CreateOptimizer(spec);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  optimizer_ = std::move(optimizer);
}

bool LocalKVStore::UpdatesOnDevice(const std::vector<Array>& values) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  const bool compressed = values.size() > 1 && compression_.AppliesTo(values[0].size());
  return UpdatedOnDevice(type_, values, optimizer_.get(), compressed);
}

std::optional<CompressionSpec> LocalKVStore::CompressesEachOnDevice(
    const std::vector<Array>& values) const {
  if (type_ != "device" || values.size() < 2 || !FloatValuesOnDevices(values)) return std::nullopt;
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (!compression_.AppliesTo(values[0].size())) return std::nullopt;
  return compression_;
}

bool LocalKVStore::HoldsOnDevice(Key key) const {
  Slot* slot = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = slots_.find(key);
    if (it == slots_.end()) return false;
    slot = it->second.get();
  }
  std::lock_guard<std::mutex> lock(slot->mutex);
  return slot->value.on_device();
}

void LocalKVStore::Apply(Key key, Slot& slot, const std::vector<Array>& values,
                         Optimizer* optimizer, const CompressionSpec* compression,
                         bool packed) const {
  if (!packed && UpdatedOnDevice(type_, values, optimizer, compression != nullptr)) {
    if (optimizer == nullptr) {
      // The sum is the key's value from now on, on its GPU and named as made on dtrain's stream
      // there (as MXNet's local store takes the merged array as it is): pulls copy from it there.
      slot.value = cuda::StartSumOnDevice(values);
      return;
    }
    // A key's first update on this GPU copies its weight there (waiting for that copy only).
    const Array weight = MovedToDevice(slot.value, values[0].device());
    const Array grad = cuda::StartSumOnDevice(values);
    // The weight's stream is the sum's (dtrain's, on that GPU): its update, the copies of pulls
    // and the sum's release then run in the order they were queued. Set once the sum is queued,
    // so a failed push leaves the slot as it was.
    slot.value = OnStream(weight, grad.stream());
    optimizer->UpdateOnDevice(static_cast<uint64_t>(key), slot.value, grad);
    return;
  }
  if (std::any_of(values.begin(), values.end(), [](const Array& a) { return a.on_device(); })) {
    // Not summed on a GPU (several values to "local", compression between them, values mixed
    // with host ones, non-float32 ones for an optimizer; DeviceStagingKVStore stages these, a
    // direct caller may not): through the host, copied there before the slot changes at all.
    Apply(key, slot, cuda::ToHost(values), optimizer, compression, packed);
    return;
  }
  if (slot.value.on_device()) {
    // Back to the host: the weight, which an update changes; without an optimizer the sum below
    // replaces the value whole.
    slot.value = optimizer != nullptr ? cuda::ToHost(slot.value).Clone()
                                      : Array(slot.layout.shape(), slot.layout.dtype());
  }
  std::vector<std::vector<float>>* residuals = nullptr;  // none for packed values: the caller's
  if (compression != nullptr && !packed) {
    residuals = &slot.residuals;
    if (residuals->size() < values.size()) residuals->resize(values.size());
    for (auto& r : *residuals) r.resize(static_cast<size_t>(slot.value.size()), 0.0f);
  }
  if (optimizer == nullptr) {
    Sum(slot.value, values, residuals, compression);
    return;
  }
  Array grad = values[0];  // one device: update straight from the caller's array, no copy
  if (values.size() > 1 || packed) {
    if (!slot.merged.defined()) slot.merged = Array(slot.value.shape(), slot.value.dtype());
    Sum(slot.merged, values, residuals, compression);
    grad = slot.merged;
  }
  optimizer->Update(static_cast<uint64_t>(key), slot.value.floats(), grad.floats());
}

void LocalKVStore::Sum(const Array& dst, const std::vector<Array>& values,
                       std::vector<std::vector<float>>* residuals,
                       const CompressionSpec* compression) const {
  const DType dtype = dst.dtype();
  const size_t elem = DTypeSize(dtype);
  // Each thread copies then adds its own range, so the range stays in that core's cache.
  auto sum_range = [&](int64_t begin, int64_t end) {
    const size_t offset = static_cast<size_t>(begin) * elem;
    const int64_t n = end - begin;
    if (n <= 0) return;
    if (compression != nullptr && residuals == nullptr) {
      // Compressed by the caller: the range's words (it starts at a word, see below).
      const size_t at = CompressedBytes(compression->type, begin);
      for (size_t d = 0; d < values.size(); ++d) {
        Decompress(*compression, values[d].bytes() + at, n, dst.floats().data() + begin, d > 0);
      }
      return;
    }
    if (residuals != nullptr) {
      // Element-wise, so ranges compress alone: each device's values, as they would cross.
      std::vector<char> packed(CompressedBytes(compression->type, n));
      for (size_t d = 0; d < values.size(); ++d) {
        Compress(*compression, values[d].floats().data() + begin, (*residuals)[d].data() + begin, n,
                 packed.data());
        Decompress(*compression, packed.data(), n, dst.floats().data() + begin, d > 0);
      }
      return;
    }
    std::memcpy(dst.bytes() + offset, values[0].bytes() + offset, static_cast<size_t>(n) * elem);
    for (size_t i = 1; i < values.size(); ++i) {
      AddInto(dst.bytes() + offset, values[i].bytes() + offset, n, dtype);
    }
  };
  const int64_t size = dst.size();
  const int threads = size >= bigarray_bound_ ? reduction_threads_ : 1;
  if (threads <= 1) {
    sum_range(0, size);
    return;
  }
  // Ranges start on 64-byte boundaries so that no two threads write one cache line, and compressed
  // ones at a word of every format (a 1-bit word holds 32 values).
  int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(elem));
  if (compression != nullptr) align = std::max(align, kCompressionAlignment);
  const int64_t per_thread = (size / threads + align - 1) / align * align;
  std::vector<std::jthread> workers;
  workers.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) {
    const int64_t begin = std::min(size, t * per_thread);
    const int64_t end = t + 1 == threads ? size : std::min(size, (t + 1) * per_thread);
    try {
      workers.emplace_back(sum_range, begin, end);
    } catch (const std::system_error&) {
      sum_range(begin, end);  // no thread to be had: still a correct sum, only slower
    }
  }
  sum_range(0, std::min(size, per_thread));
}

void LocalKVStore::SetGradientCompression(const std::map<std::string, std::string>& params) {
  const CompressionSpec spec = CompressionSpec::FromParams(params);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (pushed_.load(std::memory_order_relaxed)) {
    throw InvalidArgument("set_gradient_compression after a push: set it before the first push");
  }
  compression_ = spec;
}

CompressionSpec LocalKVStore::gradient_compression() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return compression_;
}

}  // namespace dtrain

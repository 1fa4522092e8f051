#include "kvstore/device_staging_kvstore.h"

#include <algorithm>

#include "common/config/config.h"
#include "compression/codec.h"
#include "compression/kernels/device_codec.h"
#include "dtrain/common/error.h"
#include "kvstore/array_checks.h"
#include "kvstore/key_names.h"
#include "kvstore/operation_state.h"
#include "report/timeline.h"

namespace dtrain {
namespace {

bool AnyOnDevice(const std::vector<Array>& arrays) {
  return std::any_of(arrays.begin(), arrays.end(), [](const Array& a) { return a.on_device(); });
}

// "device", "dist_sync_device", "dist_async_device" (Create has resolved the aliases).
bool AggregatesOnDevice(const std::string& type) {
  return type == "device" || type.ends_with("_device");
}

// Waits until the copies into `staged`'s host arrays have ended, whatever became of them, before
// those pinned buffers (and the device buffers the copies read) may go back to their pools. Only
// a call that did not await every piece (it failed before, or part of the way) waits here.
void LetCopiesEnd(const cuda::Staged& staged) {
  if (staged.pieces.empty()) return;
  try {
    staged.copied.Wait("copy to the host");
  } catch (const std::exception&) {
    // The call's error says what went wrong; a copy that never ends is the GPU's own failure.
  }
}

// Completes `state` with `op`'s outcome.
void Forward(const Operation& op, const std::shared_ptr<OperationState>& state) {
  op.OnDone([state](std::exception_ptr error) { state->PartDone(error); });
}

}  // namespace

DeviceStagingKVStore::DeviceStagingKVStore(std::unique_ptr<KVStore> inner)
    : inner_(std::move(inner)),
      staged_(dynamic_cast<StagedCalls*>(inner_.get())),
      device_updates_(dynamic_cast<DeviceUpdates*>(inner_.get())),
      packed_pushes_(dynamic_cast<PackedPushes*>(inner_.get())),
      aggregate_on_device_(AggregatesOnDevice(inner_->type())),
      timeout_(Config::FromEnvironment().request_timeout),
      piece_bytes_(staged_ != nullptr ? Config::FromEnvironment().chunk_bytes : 0) {}

DeviceStagingKVStore::~DeviceStagingKVStore() {
  // The calls still queued reach the wrapped store first (its own destructor then waits for its
  // operations, as it does unless the job has failed: no wait here, which a dead peer could make
  // last the whole request timeout). Completions that come after the copy-back queue has gone
  // wait for their copies on their own thread instead.
  staging_.reset();
  {
    std::lock_guard<std::mutex> lock(copy_back_->mutex);
    copy_back_->queue = nullptr;
  }
  copying_back_.reset();
}

cuda::Staged DeviceStagingKVStore::StartStaging(const std::vector<Array>& values) const {
  if (!AnyOnDevice(values)) return {values, cuda::Fence(), {}};
  const bool all_on_device =
      std::all_of(values.begin(), values.end(), [](const Array& a) { return a.on_device(); });
  const bool same_layout = std::all_of(values.begin(), values.end(), [&](const Array& a) {
    return a.size() == values[0].size() && a.dtype() == values[0].dtype();
  });
  // Where compression applies, a local or device store compresses each device's value before
  // summing: keep them apart. (Compressed pushes of device values to a dist store or "device"
  // took StartCompressing.)
  if (aggregate_on_device_ && values.size() > 1 && all_on_device && same_layout &&
      !inner_->gradient_compression().AppliesTo(values[0].size())) {
    return cuda::StartSumToHost(values, piece_bytes_);
  }
  // Mismatched layouts of keys this store saw initialised were refused at the call (CheckLayout);
  // others reach the wrapped store as they are, which rejects them by key.
  return cuda::StartToHost(values, piece_bytes_);
}

std::optional<DeviceStagingKVStore::DeviceCompression> DeviceStagingKVStore::CompressesOnDevice(
    const std::vector<Array>& values) const {
  if (packed_pushes_ != nullptr) {
    std::optional<CompressionSpec> each = packed_pushes_->CompressesEachOnDevice(values);
    if (!each) return std::nullopt;
    return DeviceCompression{*each, true};
  }
  if (staged_ == nullptr || !FloatValuesOnDevices(values)) return std::nullopt;
  const CompressionSpec spec = inner_->gradient_compression();
  if (!spec.AppliesTo(values[0].size())) return std::nullopt;
  return DeviceCompression{spec, false};
}

Array DeviceStagingKVStore::ResidualOn(Key key, size_t index, const Array& like, bool each) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = residuals_.find({key, index});
    if (it != residuals_.end()) {
      if (it->second.device() != like.device()) {
        const std::string where = " on GPU " + std::to_string(it->second.device()) +
                                  ", where its residual (gradient compression's error feedback) "
                                  "lives: keep ";
        throw InvalidArgument("push of key " + KeyLabel(key) + ": " +
                              (each ? "its value " + std::to_string(index) + " is on GPU " +
                                          std::to_string(like.device()) +
                                          ", its compressed pushes so far compressed it" + where +
                                          "each of a key's values on one GPU"
                                    : "its values are on GPU " + std::to_string(like.device()) +
                                          ", its compressed pushes so far were summed" + where +
                                          "a key's first value on one GPU"));
      }
      return it->second;
    }
  }
  // Zeroed on the stream the compression runs on, without waiting (this is autograd's thread).
  Array zeros = cuda::ZerosForEncoders(like.device(), like.shape(), DType::kFloat32);
  std::lock_guard<std::mutex> lock(mutex_);
  return residuals_.emplace(std::make_pair(key, index), std::move(zeros)).first->second;
}

namespace {

// `spec`'s compression of n floats on `device`, with `residual` (undefined for fp16, which keeps
// none) as its error feedback there.
cuda::DeviceEncoder CompressingEncoder(const CompressionSpec& spec, int64_t n, int device,
                                       Array residual) {
  cuda::DeviceEncoder encoder;
  // Carried as 16-bit units (every compressed size is even): only its bytes are read.
  encoder.shape = {static_cast<int64_t>(CompressedBytes(spec.type, n) / 2)};
  encoder.dtype = DType::kFloat16;
  encoder.encode = [spec, residual, n, device](const void* value, void* out, void* stream) {
    auto* r = residual.defined() ? static_cast<float*>(residual.data()) : nullptr;
    CompressOnDevice(spec, static_cast<const float*>(value), r, n, out, device, stream);
  };
  return encoder;
}

}  // namespace

cuda::Staged DeviceStagingKVStore::StartCompressing(Key key, const std::vector<Array>& values,
                                                    const DeviceCompression& how) {
  const CompressionSpec& spec = how.spec;
  const int64_t n = values[0].size();
  auto residual = [&](size_t index) {
    return spec.type == Compression::kFp16 ? Array()
                                           : ResidualOn(key, index, values[index], how.each);
  };
  if (how.each) {
    std::vector<cuda::DeviceEncoder> encoders;
    for (size_t i = 0; i < values.size(); ++i) {
      encoders.push_back(CompressingEncoder(spec, n, values[i].device(), residual(i)));
    }
    return cuda::StartEachEncodedToHost(values, encoders);
  }
  // In pieces of the compressed size of a slot of floats, so that slots and pieces match.
  const size_t piece =
      CompressedBytes(spec.type, static_cast<int64_t>(piece_bytes_ / sizeof(float)));
  return cuda::StartSumToHost(values, CompressingEncoder(spec, n, values[0].device(), residual(0)),
                              piece);
}

bool DeviceStagingKVStore::MustQueue(const std::vector<Array>& values) {
  if (AnyOnDevice(values)) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  return staging_ && !staging_->idle();
}

void DeviceStagingKVStore::Track(const Operation& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(in_flight_, [](const Operation& o) { return o.done(); });
  in_flight_.push_back(op);
}

Operation DeviceStagingKVStore::Later(Key key, const char* verb, cuda::Staged staged,
                                      StagedCallback call) {
  const std::string what = std::string(verb) + " of key " + KeyLabel(key);
  auto state = std::make_shared<OperationState>(what, 1, timeout_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!staging_) staging_ = std::make_unique<SerialQueue>("kvstore staging of device values");
    staging_->Post([key, what, state, staged = std::move(staged), call = std::move(call),
                    queued = timeline::Now()] {
      const std::string copy = "copy of the values of the " + what + " to the host";
      // From the call to the values' (last) arrival on the host.
      auto arrived = [key, queued] {
        if (timeline::Enabled()) {
          timeline::Complete("to_host", "kvstore", queued, timeline::Now(),
                             timeline::Args().Str("key", KeyLabel(key)));
        }
      };
      try {
        Awaited await;
        if (staged.pieces.empty()) {
          staged.copied.Wait(copy);
          arrived();
        } else {
          await = [pieces = staged.pieces, copy, arrived, next = size_t{0},
                   told = false](size_t bytes) mutable {
            while (next + 1 < pieces.size() && pieces[next].bytes < bytes) ++next;
            pieces[next].copied.Wait(copy);  // pieces are copied in order, on one stream
            if (next + 1 == pieces.size() && !told) {
              told = true;
              arrived();
            }
          };
        }
        Operation op = call(staged.hosts, std::move(await));
        LetCopiesEnd(staged);
        Forward(op, state);
      } catch (...) {
        LetCopiesEnd(staged);
        state->PartDone(std::current_exception());
      }
    });
  }
  Operation op(state);
  Track(op);
  return op;
}

namespace {

// The copies to the device outputs of the parts of a pulled value that the wrapped store reported
// (on its network threads), for the thread that waits for them.
struct PartCopies {
  std::mutex mutex;
  std::vector<cuda::Fence> fences;
  size_t bytes = 0;  // reported so far
  std::exception_ptr error;
};

// Completes `state` on the copy-back thread once every fence of `copies` has passed (the call's
// own `error` first, else the first copy's failure); `succeeded` runs there before, if all went
// well. On the calling thread once the store is closing (its copy-back thread has gone).
void CompleteAfterCopies(DeviceStagingKVStore::CopyBack& copy_back,
                         std::shared_ptr<OperationState> state, const std::string& what,
                         std::vector<cuda::Fence> copies, std::exception_ptr error,
                         std::function<void()> succeeded) {
  auto complete = [state = std::move(state), what, copies = std::move(copies), error,
                   succeeded = std::move(succeeded)] {
    std::exception_ptr outcome = error;
    for (const cuda::Fence& copied : copies) {
      try {
        copied.Wait(what);
      } catch (...) {
        if (!outcome) outcome = std::current_exception();
      }
    }
    try {
      if (!outcome && succeeded) succeeded();
    } catch (...) {
      outcome = std::current_exception();
    }
    state->PartDone(outcome);
  };
  {
    std::lock_guard<std::mutex> lock(copy_back.mutex);
    if (copy_back.queue != nullptr) {
      copy_back.queue->Post(std::move(complete));
      return;
    }
  }
  // The store is closing: waited for here, so that no copy still runs into or out of buffers
  // that go once the operation is done.
  complete();
}

}  // namespace

Operation DeviceStagingKVStore::IntoOutputs(
    Key key, std::vector<Array> outs,
    const std::function<Operation(std::vector<Array> hosts, OutputReady ready)>& call) {
  if (!AnyOnDevice(outs)) return call(std::move(outs), nullptr);
  // The wrapped store writes host arrays: the host outputs themselves, one pinned array shared by
  // the device outputs of the first one's layout, and (so that the store names the error at the
  // call) a pinned array for any device output of another layout.
  Array staging;
  std::vector<Array> hosts, devices;
  for (const Array& out : outs) {
    if (!out.on_device()) {
      hosts.push_back(out);
      continue;
    }
    devices.push_back(out);
    if (!staging.defined()) {
      staging = cuda::PinnedLike(out);
      hosts.push_back(staging);
    } else if (out.size() != staging.size() || out.dtype() != staging.dtype()) {
      hosts.push_back(cuda::PinnedLike(out));
    }
  }
  StartCopyingBack();
  const std::string what = "pull of key " + KeyLabel(key) + " into device memory";
  auto state = std::make_shared<OperationState>(what, 1, timeout_);
  // Each part the store reports is copied on at once (the wrapped store checked every output
  // against the key, so `staging` has the reported bytes too). Errors wait for the end.
  auto parts = std::make_shared<PartCopies>();
  OutputReady ready = [parts, staging, devices](size_t begin, size_t end) {
    std::lock_guard<std::mutex> lock(parts->mutex);
    if (parts->error) return;
    try {
      parts->fences.push_back(cuda::StartCopyFromHost(staging, devices, begin, end));
      parts->bytes += end - begin;
    } catch (...) {
      parts->error = std::current_exception();
    }
  };
  // Once pulled (on the wrapped store's thread): start the copies not started yet, and wait for
  // them all on the copy-back thread so that the store's thread goes on with other keys.
  call(std::move(hosts), std::move(ready))
      .OnDone([key, state, staging, devices, what, parts,
               copy_back = copy_back_](std::exception_ptr error) {
        std::vector<cuda::Fence> copies;
        try {
          std::lock_guard<std::mutex> lock(parts->mutex);
          if (!error) error = parts->error;
          copies = std::move(parts->fences);
          // Not reported, or not all of it (a store that tells no parts): copied whole.
          if (!error && parts->bytes != staging.nbytes()) {
            copies.push_back(cuda::StartCopyFromHost(staging, devices));
          }
        } catch (...) {
          error = std::current_exception();
        }
        // Even a failed pull waits for the copies it started: they write the user's tensors and
        // read `staging`, which must stay as it is until then (the lambda below keeps it).
        CompleteAfterCopies(*copy_back, state, what, std::move(copies), error,
                            [key, staging, pulled = timeline::Now()] {
                              if (timeline::Enabled()) {  // from the pulled value's arrival
                                timeline::Complete("to_device", "kvstore", pulled, timeline::Now(),
                                                   timeline::Args().Str("key", KeyLabel(key)));
                              }
                            });
      });
  Operation op(state);
  Track(op);
  return op;
}

void DeviceStagingKVStore::StartCopyingBack() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!copying_back_) {
    copying_back_ = std::make_unique<SerialQueue>("kvstore copies into device memory");
    std::lock_guard<std::mutex> queue_lock(copy_back_->mutex);
    copy_back_->queue = copying_back_.get();
  }
}

Operation DeviceStagingKVStore::OnceCopied(Key key, const char* verb, Operation op,
                                           const std::vector<Array>& outs) {
  if (!AnyOnDevice(outs)) return op;
  const cuda::Fence copied = cuda::AfterQueuedWork(outs);
  StartCopyingBack();
  const std::string what = std::string(verb) + " of key " + KeyLabel(key) + " into device memory";
  auto state = std::make_shared<OperationState>(what, 1, timeout_);
  op.OnDone([state, copied, what, copy_back = copy_back_](std::exception_ptr error) {
    CompleteAfterCopies(*copy_back, state, what, {copied}, error, nullptr);
  });
  Operation done(state);
  Track(done);
  return done;
}

void DeviceStagingKVStore::Flush() {
  SerialQueue* queue = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue = staging_.get();
  }
  if (queue != nullptr) queue->Drain(timeout_);
}

bool DeviceStagingKVStore::CheckLayout(const char* call, Key key, const std::vector<Array>& arrays,
                                       const char* what) {
  Array layout;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = layouts_.find(key);
    if (it == layouts_.end()) return false;
    layout = it->second;
  }
  CheckArrays(call, key, layout, arrays, what);
  return true;
}

void DeviceStagingKVStore::Init(Key key, const Array& value) {
  Flush();
  inner_->Init(key, value.on_device() ? cuda::ToHost(value) : value);
  std::lock_guard<std::mutex> lock(mutex_);
  layouts_[key] = Array::Wrap(nullptr, value.shape(), value.dtype(), nullptr);
}

bool DeviceStagingKVStore::UpdatedOnDevice(const std::vector<Array>& values) {
  if (device_updates_ == nullptr || !AnyOnDevice(values) ||
      !device_updates_->UpdatesOnDevice(values)) {
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // From the staging thread itself (a callback of a staged operation), the calls queued before
    // this one cannot be waited for: staged behind them instead.
    if (staging_ && staging_->OnItsThread()) return false;
  }
  Flush();  // calls queued before this one reach the wrapped store first
  return true;
}

Operation DeviceStagingKVStore::PushRows(Key key, std::vector<int64_t> rows, const Array& values,
                                         int priority) {
  if (MustQueue({values})) Flush();
  return inner_->PushRows(key, std::move(rows), values, priority);
}

Operation DeviceStagingKVStore::PullRows(Key key, std::vector<int64_t> rows, const Array& out,
                                         int priority) {
  if (MustQueue({out})) Flush();
  return inner_->PullRows(key, std::move(rows), out, priority);
}

Operation DeviceStagingKVStore::Push(Key key, std::vector<Array> values, int priority) {
  if (!MustQueue(values) || UpdatedOnDevice(values)) {
    return inner_->Push(key, std::move(values), priority);
  }
  if (!CheckLayout("Push", key, values, "value")) {
    Flush();
    return inner_->Push(key, cuda::ToHost(values), priority);
  }
  std::optional<DeviceCompression> compressed = CompressesOnDevice(values);
  cuda::Staged staged =
      compressed ? StartCompressing(key, values, *compressed) : StartStaging(values);
  return Later(key, "push", std::move(staged),
               [this, key, compressed, priority](std::vector<Array> hosts, Awaited await) {
                 if (compressed && compressed->each) {
                   return packed_pushes_->PushPacked(key, compressed->spec, std::move(hosts), {});
                 }
                 if (staged_ == nullptr || hosts.empty()) {
                   return inner_->Push(key, std::move(hosts), priority);
                 }
                 StagedCall call = StagedCall::Of(key, std::move(hosts), {}, priority);
                 if (compressed) call.packed = compressed->spec;
                 call.await_value = std::move(await);
                 return staged_->IssueStaged(std::move(call));
               });
}

Operation DeviceStagingKVStore::Pull(Key key, std::vector<Array> outs, int priority) {
  auto pull = [this, key, outs, priority](std::vector<Array>, Awaited) {
    if (device_updates_ != nullptr && device_updates_->HoldsOnDevice(key)) {
      return OnceCopied(key, "pull", inner_->Pull(key, outs, priority), outs);  // on the GPU
    }
    return IntoOutputs(key, outs, [&](std::vector<Array> hosts, OutputReady ready) {
      if (staged_ == nullptr) return inner_->Pull(key, std::move(hosts), priority);
      StagedCall call = StagedCall::Of(key, {}, std::move(hosts), priority);
      call.output_ready = std::move(ready);
      return staged_->IssueStaged(std::move(call));
    });
  };
  if (!MustQueue({})) return pull({}, nullptr);
  if (!CheckLayout("Pull", key, outs, "out")) {
    Flush();
    return pull({}, nullptr);
  }
  return Later(key, "pull", cuda::Staged{}, std::move(pull));
}

Operation DeviceStagingKVStore::PushPull(Key key, std::vector<Array> values,
                                         std::vector<Array> outs, int priority) {
  // `compressed`: the staged values were compressed on their GPUs (StartCompressing).
  auto pushpull = [this, key, outs, priority](std::optional<DeviceCompression> compressed) {
    return [this, key, outs, priority, compressed](std::vector<Array> staged, Awaited await) {
      return IntoOutputs(key, outs, [&](std::vector<Array> hosts, OutputReady ready) {
        if (compressed && compressed->each) {
          return packed_pushes_->PushPacked(key, compressed->spec, std::move(staged),
                                            std::move(hosts));
        }
        // (Staged calls tell a pushpull from the others by its arrays: none may be missing.)
        if (staged_ == nullptr || staged.empty() || hosts.empty()) {
          return inner_->PushPull(key, std::move(staged), std::move(hosts), priority);
        }
        StagedCall call = StagedCall::Of(key, std::move(staged), std::move(hosts), priority);
        if (compressed) call.packed = compressed->spec;
        call.await_value = std::move(await);
        call.output_ready = std::move(ready);
        return staged_->IssueStaged(std::move(call));
      });
    };
  };
  if (UpdatedOnDevice(values)) {
    return OnceCopied(key, "pushpull", inner_->PushPull(key, std::move(values), outs, priority),
                      outs);
  }
  if (!MustQueue(values)) return pushpull(std::nullopt)(std::move(values), nullptr);
  if (!CheckLayout("PushPull", key, values, "value") ||
      (!outs.empty() && !CheckLayout("PushPull", key, outs, "out"))) {
    Flush();
    return pushpull(std::nullopt)(cuda::ToHost(values), nullptr);
  }
  // (An empty `outs` goes the plain way, whose wrapped store names the mistake.)
  std::optional<DeviceCompression> compressed =
      outs.empty() ? std::nullopt : CompressesOnDevice(values);
  cuda::Staged staged =
      compressed ? StartCompressing(key, values, *compressed) : StartStaging(values);
  return Later(key, "pushpull", std::move(staged), pushpull(compressed));
}

void DeviceStagingKVStore::WaitAll() {
  Flush();
  inner_->WaitAll();
  std::vector<Operation> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(in_flight_);
  }
  for (const Operation& op : pending) op.Wait();
}

}  // namespace dtrain

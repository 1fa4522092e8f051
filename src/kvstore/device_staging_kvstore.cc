#include "kvstore/device_staging_kvstore.h"

#include <algorithm>

#include "cuda/cuda.h"
#include "dtrain/common/error.h"

namespace dtrain {
namespace {

bool AnyOnDevice(const std::vector<Array>& arrays) {
  return std::any_of(arrays.begin(), arrays.end(), [](const Array& a) { return a.on_device(); });
}

// "device", "dist_sync_device", "dist_async_device" (Create has resolved the aliases).
bool AggregatesOnDevice(const std::string& type) {
  return type == "device" || type.ends_with("_device");
}

}  // namespace

DeviceStagingKVStore::DeviceStagingKVStore(std::unique_ptr<KVStore> inner)
    : inner_(std::move(inner)), aggregate_on_device_(AggregatesOnDevice(inner_->type())) {}

std::vector<Array> DeviceStagingKVStore::StageValues(const std::vector<Array>& values) const {
  if (!AnyOnDevice(values)) return values;
  const bool all_on_device =
      std::all_of(values.begin(), values.end(), [](const Array& a) { return a.on_device(); });
  const bool same_layout = std::all_of(values.begin(), values.end(), [&](const Array& a) {
    return a.size() == values[0].size() && a.dtype() == values[0].dtype();
  });
  // With compression the store compresses each device's value before summing: keep them apart.
  if (aggregate_on_device_ && values.size() > 1 && all_on_device && same_layout &&
      !inner_->gradient_compression().enabled()) {
    Array sum = cuda::CloneOnDevice(values[0]);
    for (size_t i = 1; i < values.size(); ++i) cuda::AddInto(sum, values[i]);
    return {cuda::ToHost(sum)};
  }
  // Mismatched layouts reach the wrapped store as they are, which rejects them by key.
  return cuda::ToHost(values);
}

Operation DeviceStagingKVStore::IntoOutputs(
    Key key, std::vector<Array> outs,
    const std::function<Operation(std::vector<Array> hosts)>& call) {
  if (!AnyOnDevice(outs)) return call(std::move(outs));
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
  Operation done = call(std::move(hosts))
                       .Then([staging, devices] { cuda::CopyFromHost(staging, devices); },
                             "pull of key " + std::to_string(key) + " into device memory");
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(copying_back_, [](const Operation& o) { return o.done(); });
  copying_back_.push_back(done);
  return done;
}

void DeviceStagingKVStore::Init(Key key, const Array& value) {
  inner_->Init(key, value.on_device() ? cuda::ToHost(value) : value);
}

Operation DeviceStagingKVStore::Push(Key key, std::vector<Array> values, int priority) {
  return inner_->Push(key, StageValues(values), priority);
}

Operation DeviceStagingKVStore::Pull(Key key, std::vector<Array> outs, int priority) {
  return IntoOutputs(key, std::move(outs), [&](std::vector<Array> hosts) {
    return inner_->Pull(key, std::move(hosts), priority);
  });
}

Operation DeviceStagingKVStore::PushPull(Key key, std::vector<Array> values,
                                         std::vector<Array> outs, int priority) {
  auto staged = StageValues(values);
  return IntoOutputs(key, std::move(outs), [&](std::vector<Array> hosts) {
    return inner_->PushPull(key, std::move(staged), std::move(hosts), priority);
  });
}

void DeviceStagingKVStore::WaitAll() {
  inner_->WaitAll();
  std::vector<Operation> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(copying_back_);
  }
  for (const Operation& op : pending) op.Wait();
}

}  // namespace dtrain

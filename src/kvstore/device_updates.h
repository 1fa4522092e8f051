// How DeviceStagingKVStore, which moves CUDA values through pinned host memory, learns that the
// store it wraps would rather take them as they are: MXNet's local stores with an optimizer keep a
// key's weight on the GPU its merged gradient is on and run the update there
// (KVStoreLocal::PushImpl copies the weight to the merged value's context), and without one take
// the merged array as the key's value (`local = merged`), which pulls then copy from; so neither
// the gradient nor the value crosses to the host in a round.
// Implemented by LocalKVStore ("local" and "device").
#pragma once

#include <vector>

#include "dtrain/common/array.h"
#include "dtrain/kvstore/kvstore.h"

namespace dtrain {

class DeviceUpdates {
 public:
  virtual ~DeviceUpdates() = default;

  // Whether a push of `values` is summed and applied (assigned, or updated by the optimizer) on
  // their GPU: they are values on devices, float32 where an optimizer is in place, that the store
  // merges on a device ("device": any number of them, summed on the first one's GPU; "local": a
  // single one, which MXNet's CPU merge passes on as it is), without gradient compression between
  // them. Push and PushPull then take them as they are, and their outputs anywhere.
  virtual bool UpdatesOnDevice(const std::vector<Array>& values) const = 0;
  // Whether `key`'s value is in a GPU's memory now (its last update ran there): Pull then takes
  // device outputs as they are, copied on the GPU. False for a key never initialised.
  virtual bool HoldsOnDevice(Key key) const = 0;
};

}  // namespace dtrain

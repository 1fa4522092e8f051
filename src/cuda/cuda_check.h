// Turns CUDA runtime errors into dtrain errors that say what was being done.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "dtrain/common/error.h"

namespace dtrain::cuda {

inline void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorName(status) + " (" +
                cudaGetErrorString(status) + ")");
  }
}

// Makes `device` current on this thread for the guard's life, then restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    Check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) Check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace dtrain::cuda

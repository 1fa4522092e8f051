// Array: a dense n-dimensional value, the unit that KVStore init/push/pull move.
//
// Copies of an Array share their memory, as MXNet's NDArray handles do: a pull writes into the
// memory of the Array the caller passed, and a push keeps its source alive until it is sent.
// An Array can own its memory or wrap memory owned by someone else (a LibTorch tensor), kept alive
// through `owner`. An Array may also live in a CUDA device's memory (`device() >= 0`, made only by
// WrapDevice): the core moves such arrays with CUDA (staged via pinned host memory, summed with
// CUDA kernels; docs/design.md, "GPUs") and refuses them in its host-only operations. Not
// synchronised: callers must not write an Array that an unfinished push reads, nor read one that
// an unfinished pull writes (wait on the operation first).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/common/dtype.h"

namespace dtrain {

using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);

class Array {
 public:
  Array() = default;
  // Zero-filled array.
  explicit Array(Shape shape, DType dtype = DType::kFloat32);

  static Array FromFloats(std::span<const float> values, Shape shape = {});
  // Wraps external memory; `owner` keeps it alive for as long as any copy of this Array lives.
  static Array Wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> owner);
  // Wraps CUDA device memory of device `device`, written by work queued on `stream` (a
  // cudaStream_t; null is the default stream): dtrain orders its copies after that work.
  static Array WrapDevice(void* data, Shape shape, DType dtype, int device, void* stream,
                          std::shared_ptr<void> owner);

  bool defined() const { return data_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t size() const { return size_; }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(size_) * DTypeSize(dtype_); }

  // The CUDA device holding the values, or kHost.
  static constexpr int kHost = -1;
  int device() const { return device_; }
  bool on_device() const { return device_ != kHost; }
  void* stream() const { return stream_; }

  void* data() const { return data_; }
  char* bytes() const { return static_cast<char*>(data_); }
  // Typed view; throws InvalidArgument if the dtype is not float32 or the array is on a device.
  std::span<float> floats() const;
  std::vector<float> ToVector() const;

  // Host operations (InvalidArgument for a device array). A deep copy in new memory:
  Array Clone() const;
  // Copies `other`'s contents into this array's memory; sizes and dtypes must match.
  void CopyFrom(const Array& other) const;
  void Fill(float value) const;
  // Throws InvalidArgument, naming `what`, if this array is on a device.
  void RequireHost(const char* what) const;

  const std::shared_ptr<void>& owner() const { return owner_; }

 private:
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  Shape shape_;
  int64_t size_ = 0;
  DType dtype_ = DType::kFloat32;
  int device_ = kHost;
  void* stream_ = nullptr;
};

}  // namespace dtrain

#include "dtrain/common/array.h"

#include <cstring>
#include <sstream>

#include "common/buffer_pool.h"
#include "dtrain/common/error.h"

namespace dtrain {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw InvalidArgument("negative dimension in shape " + ShapeToString(shape));
    n *= d;
  }
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  if (shape.size() == 1) out << ",";
  out << ")";
  return out.str();
}

Array::Array(Shape shape, DType dtype)
    : shape_(std::move(shape)), size_(NumElements(shape_)), dtype_(dtype) {
  auto buffer = BufferPool::Default().Get(nbytes());
  data_ = buffer.get();
  owner_ = std::move(buffer);
  std::memset(data_, 0, nbytes());
}

Array Array::FromFloats(std::span<const float> values, Shape shape) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  if (NumElements(shape) != static_cast<int64_t>(values.size())) {
    throw InvalidArgument("shape " + ShapeToString(shape) + " does not hold " +
                          std::to_string(values.size()) + " values");
  }
  Array a(std::move(shape), DType::kFloat32);
  // An empty span may have a null data(), which memcpy must not get even for 0 bytes.
  if (!values.empty()) std::memcpy(a.data_, values.data(), values.size_bytes());
  return a;
}

Array Array::Wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> owner) {
  Array a;
  a.shape_ = std::move(shape);
  a.size_ = NumElements(a.shape_);
  a.dtype_ = dtype;
  a.data_ = data;
  a.owner_ = std::move(owner);
  return a;
}

Array Array::WrapDevice(void* data, Shape shape, DType dtype, int device, void* stream,
                        std::shared_ptr<void> owner) {
  if (device < 0)
    throw InvalidArgument("device id must be 0 or more, got " + std::to_string(device));
  Array a = Wrap(data, std::move(shape), dtype, std::move(owner));
  a.device_ = device;
  a.stream_ = stream;
  return a;
}

void Array::RequireHost(const char* what) const {
  if (on_device()) {
    throw InvalidArgument(std::string(what) + ": the array is on CUDA device " +
                          std::to_string(device_) + ", and this operation runs on the host");
  }
}

std::span<float> Array::floats() const {
  RequireHost("Array::floats");
  if (dtype_ != DType::kFloat32) {
    throw InvalidArgument("array of " + std::string(DTypeName(dtype_)) + " used as float32");
  }
  return {static_cast<float*>(data_), static_cast<size_t>(size_)};
}

std::vector<float> Array::ToVector() const {
  auto f = floats();
  return {f.begin(), f.end()};
}

Array Array::Clone() const {
  RequireHost("Array::Clone");
  Array copy(shape_, dtype_);
  if (nbytes() > 0) std::memcpy(copy.data_, data_, nbytes());
  return copy;
}

void Array::CopyFrom(const Array& other) const {
  if (other.size_ != size_ || other.dtype_ != dtype_) {
    throw InvalidArgument("cannot copy " + ShapeToString(other.shape_) + " " +
                          std::string(DTypeName(other.dtype_)) + " into " + ShapeToString(shape_) +
                          " " + std::string(DTypeName(dtype_)));
  }
  RequireHost("Array::CopyFrom");
  other.RequireHost("Array::CopyFrom");
  if (data_ != other.data_ && nbytes() > 0) std::memcpy(data_, other.data_, nbytes());
}

void Array::Fill(float value) const {
  for (float& x : floats()) x = value;
}

}  // namespace dtrain

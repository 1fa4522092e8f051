// Torch tensors and dtrain Arrays over each other's memory, without copies: what every front end
// (the Trainer's ParameterSync, horovod.h, the Python extension) hands the core and takes back.
// Callers check what they accept first (contiguity, device, dtype) and say so in their own words.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "dtrain/common/array.h"
#include "train/tensor_dtype.h"

namespace dtrain::train {

// An Array over contiguous `t`'s memory as `dtype`, which keeps `t` alive. A CUDA tensor becomes a
// device Array carrying `stream` (the cudaStream_t torch queues its device's work on now), so that
// dtrain's copies and collectives wait for the work that wrote it.
inline Array ArrayOverTensor(const torch::Tensor& t, DType dtype, void* stream) {
  auto keep = std::make_shared<torch::Tensor>(t);
  Shape shape(t.sizes().begin(), t.sizes().end());
  if (t.is_cuda()) {
    return Array::WrapDevice(t.data_ptr(), std::move(shape), dtype, t.device().index(), stream,
                             std::shared_ptr<void>(keep, keep.get()));
  }
  return Array::Wrap(t.data_ptr(), std::move(shape), dtype,
                     std::shared_ptr<void>(keep, keep.get()));
}

// A tensor over `array`'s memory (host, or its GPU), which keeps the array's owner alive; it cannot
// be resized. An array without memory gives a new empty tensor of its shape.
inline torch::Tensor TensorOverArray(const Array& array) {
  std::vector<int64_t> shape(array.shape().begin(), array.shape().end());
  auto options = torch::TensorOptions().dtype(ScalarTypeOf(array.dtype()));
  if (array.on_device()) options = options.device(torch::kCUDA, array.device());
  if (!array.defined()) return torch::empty(shape, options);
  return torch::from_blob(
      array.data(), shape, [owner = array.owner()](void*) {}, options);
}

}  // namespace dtrain::train

// Torch tensors as dtrain Arrays, without copies.
//
// An Array made here points into the tensor's memory and keeps the tensor (its C++ handle, not
// the Python object) alive, so the core may hold it on any thread without the GIL. CPU and (where
// dtrain was built with CUDA) CUDA tensors, contiguous, of a float type the core moves can cross; a
// CUDA tensor becomes a device Array carrying torch's current stream of its device; anything else
// is a TypeError or ValueError naming the argument and saying what to pass instead.
#pragma once

#include <torch/extension.h>

#include <string>

#include "dtrain/common/array.h"

namespace dtrain::python {

// `what` names the argument in errors ("value of key 3", "tensor 'grad.fc1'").
Array ArrayView(const at::Tensor& tensor, const std::string& what);

// A tensor over an Array's memory (kept alive by the tensor).
at::Tensor TensorView(const Array& array);

}  // namespace dtrain::python

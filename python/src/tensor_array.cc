#include "tensor_array.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>

#include "train/tensor_dtype.h"

namespace dtrain::python {
namespace {
// torch's own name of the tensor's dtype ("torch.int64"), as users write it. Asked of Python:
// the C++ helpers for it are not exported by every torch build (PyPI's 2.x hides them).
std::string TorchDtypeName(const at::Tensor& tensor) {
  pybind11::gil_scoped_acquire gil;
  return pybind11::str(pybind11::reinterpret_steal<pybind11::object>(THPVariable_Wrap(tensor))
                           .attr("dtype"));
}
}  // namespace

Array ArrayView(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.defined()) throw pybind11::type_error(what + " is an undefined tensor");
  if (!tensor.device().is_cpu()) {
    throw pybind11::value_error(what + " is on " + tensor.device().str() +
                                "; dtrain moves CPU tensors (call .cpu())");
  }
  if (tensor.is_sparse()) throw pybind11::value_error(what + " is sparse; pass a dense tensor");
  if (!tensor.is_contiguous()) {
    throw pybind11::value_error(what + " is not contiguous; pass tensor.contiguous()");
  }
  const auto dtype = train::DTypeOf(tensor.scalar_type());
  if (!dtype) {
    throw pybind11::type_error(what + " is " + TorchDtypeName(tensor) +
                               "; dtrain moves float32, float64, float16 and bfloat16 tensors");
  }
  auto keep = std::make_shared<at::Tensor>(tensor);
  return Array::Wrap(tensor.data_ptr(), Shape(tensor.sizes().begin(), tensor.sizes().end()), *dtype,
                     std::shared_ptr<void>(keep, keep.get()));
}

at::Tensor TensorView(const Array& array) {
  auto owner = array.owner();
  std::vector<int64_t> shape(array.shape().begin(), array.shape().end());
  if (!array.defined())
    return at::empty(shape, at::TensorOptions().dtype(train::ScalarTypeOf(array.dtype())));
  return at::from_blob(
      array.data(), shape, [owner](void*) {},
      at::TensorOptions().dtype(train::ScalarTypeOf(array.dtype())));
}

}  // namespace dtrain::python

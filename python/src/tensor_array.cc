#include "tensor_array.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>

#include "cuda/cuda.h"
#include "dtrain/common/error.h"
#include "train/tensor_array.h"
#include "train/tensor_dtype.h"

namespace dtrain::python {
namespace {
// torch's own name of the tensor's dtype ("torch.int64"), as users write it. Asked of Python:
// the C++ helpers for it are not exported by every torch build (PyPI's 2.x hides them).
std::string TorchDtypeName(const at::Tensor& tensor) {
  pybind11::gil_scoped_acquire gil;
  return pybind11::str(
      pybind11::reinterpret_steal<pybind11::object>(THPVariable_Wrap(tensor)).attr("dtype"));
}
// The stream torch queues this device's work on now (torch.cuda.current_stream), as a
// cudaStream_t: dtrain's copies wait for what the user queued there. Asked of Python so that the
// extension needs no CUDA build of LibTorch's headers.
void* CurrentStream(int device) {
  pybind11::gil_scoped_acquire gil;
  auto stream = pybind11::module_::import("torch.cuda").attr("current_stream")(device);
  return reinterpret_cast<void*>(stream.attr("cuda_stream").cast<uintptr_t>());
}

}  // namespace

Array ArrayView(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.defined()) throw pybind11::type_error(what + " is an undefined tensor");
  const bool on_cuda = tensor.device().is_cuda();
  // InvalidArgument: dtrain.InvalidArgument in Python, a ValueError as well.
  if (!tensor.device().is_cpu() && !on_cuda) {
    throw InvalidArgument(what + " is on " + tensor.device().str() +
                          "; dtrain moves CPU and CUDA tensors");
  }
  if (on_cuda && !cuda::Built()) {
    throw InvalidArgument(what + " is on " + tensor.device().str() +
                          ", but this dtrain was built without CUDA (no nvcc at build time): "
                          "rebuild it where the CUDA toolkit is, or pass .cpu()");
  }
  if (tensor.is_sparse()) throw InvalidArgument(what + " is sparse; pass a dense tensor");
  if (!tensor.is_contiguous()) {
    throw InvalidArgument(what + " is not contiguous; pass tensor.contiguous()");
  }
  const auto dtype = train::DTypeOf(tensor.scalar_type());
  if (!dtype) {
    throw pybind11::type_error(what + " is " + TorchDtypeName(tensor) +
                               "; dtrain moves float32, float64, float16 and bfloat16 tensors");
  }
  return train::ArrayOverTensor(tensor, *dtype,
                                on_cuda ? CurrentStream(tensor.device().index()) : nullptr);
}

at::Tensor TensorView(const Array& array) { return train::TensorOverArray(array); }

}  // namespace dtrain::python

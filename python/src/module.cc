// The _dtrain extension module: the C++ core as the pure-Python package dtrain uses it.
#include "bindings.h"
#include "common/malloc_tuning.h"
#include "cuda/cuda.h"
#include "errors.h"

PYBIND11_MODULE(_dtrain, m) {
  m.doc() = "dtrain's C++ core (use the dtrain package rather than this module)";
  // A worker's heap keeps what each step frees for the next (common/malloc_tuning.h).
  dtrain::KeepFreedMemoryAsConfigured();
  dtrain::python::RegisterErrors(m);
  dtrain::python::RegisterRoles(m);
  dtrain::python::RegisterKVStore(m);
  dtrain::python::RegisterCollectives(m);
  dtrain::python::RegisterTraining(m);
  m.def("cuda_built", &dtrain::cuda::Built, "Whether dtrain was compiled with CUDA");
  m.def("cuda_device_count", &dtrain::cuda::DeviceCount);
  m.def("cuda_unavailable", &dtrain::cuda::Unavailable);
  m.def("mpi_built", [] {
#ifdef DTRAIN_WITH_MPI
    return true;
#else
    return false;
#endif
  });
}

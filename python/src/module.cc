// The _dtrain extension module: the C++ core as the pure-Python package dtrain uses it.
#include "bindings.h"
#include "errors.h"

PYBIND11_MODULE(_dtrain, m) {
  m.doc() = "dtrain's C++ core (use the dtrain package rather than this module)";
  dtrain::python::RegisterErrors(m);
  dtrain::python::RegisterRoles(m);
  dtrain::python::RegisterKVStore(m);
  dtrain::python::RegisterCollectives(m);
  dtrain::python::RegisterTraining(m);
}

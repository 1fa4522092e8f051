// The parts of the _dtrain extension, each registering its functions and classes on the module.
// The extension holds only calls into the C++ core; names, docstrings and argument handling for
// users are in the pure-Python package (dtrain/*.py).
//
// Every call that may block (joining a job, waiting for an operation, a barrier, a collective)
// releases the GIL, so Python threads, and autograd hooks written in Python, go on meanwhile.
#pragma once

#include <pybind11/pybind11.h>

namespace dtrain::python {

void RegisterKVStore(pybind11::module_& m);
void RegisterCollectives(pybind11::module_& m);
void RegisterTraining(pybind11::module_& m);
void RegisterRoles(pybind11::module_& m);

}  // namespace dtrain::python

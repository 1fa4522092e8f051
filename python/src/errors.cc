#include "errors.h"

#include <exception>

#include "dtrain/collectives/collectives.h"
#include "dtrain/common/error.h"

namespace py = pybind11;

namespace dtrain::python {
namespace {

// Sets the Python error to dtrain.errors.<name>(what), or RuntimeError when that module cannot
// be imported (the extension loaded on its own).
void Raise(const char* name, const char* what) {
  try {
    py::object cls = py::module_::import("dtrain.errors").attr(name);
    PyErr_SetString(cls.ptr(), what);
  } catch (py::error_already_set&) {
    PyErr_SetString(PyExc_RuntimeError, what);
  }
}

}  // namespace

void RegisterErrors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const collectives::RemovedFromJob& e) {
      Raise("RemovedFromJob", e.what());
    } catch (const InvalidArgument& e) {
      Raise("InvalidArgument", e.what());
    } catch (const ConfigError& e) {
      Raise("ConfigError", e.what());
    } catch (const PeerError& e) {
      Raise("PeerError", e.what());
    } catch (const ProtocolError& e) {
      Raise("PeerError", e.what());
    } catch (const TimeoutError& e) {
      Raise("TimeoutError", e.what());
    } catch (const Error& e) {
      Raise("Error", e.what());
    }
  });
}

}  // namespace dtrain::python

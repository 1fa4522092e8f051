// dtrain's C++ errors as Python exceptions (dtrain/errors.py):
//   InvalidArgument -> dtrain.InvalidArgument (a ValueError)   misuse: unknown key, wrong shape
//   ConfigError     -> dtrain.ConfigError (a ValueError)       a bad DMLC_*/DTRAIN_* variable
//   PeerError       -> dtrain.PeerError                        a node died or was cut off
//   ProtocolError   -> dtrain.PeerError                        a node sent what it must not
//   TimeoutError    -> dtrain.TimeoutError (a TimeoutError)    a deadline passed
//   Error           -> dtrain.Error (a RuntimeError)
// Messages are the C++ ones, which name the key or the node (role, rank, host:port).
#pragma once

#include <pybind11/pybind11.h>

namespace dtrain::python {

void RegisterErrors(pybind11::module_& m);

}  // namespace dtrain::python

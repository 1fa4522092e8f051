// _dtrain.run_role_if_service: what `import dtrain` does first, as `import mxnet` does.
#include <optional>

#include "bindings.h"
#include "common/config.h"
#include "common/logging.h"
#include "ps/roles.h"

namespace py = pybind11;

namespace dtrain::python {

void RegisterRoles(py::module_& m) {
  m.def(
      "run_role_if_service",
      []() -> std::optional<int> {
        const Config config = Config::FromEnvironment();
        SetLogVerbosity(config.verbose);
        py::gil_scoped_release no_gil;
        return ps::RunRoleIfService(config);
      },
      "With DMLC_ROLE=server or scheduler: runs that role until the job ends and returns the "
      "exit code. Otherwise returns None at once.");
}

}  // namespace dtrain::python

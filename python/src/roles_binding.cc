// _dtrain.run_role_if_service: what `import dtrain` does first, as `import mxnet` does.
#include <optional>

#include "bindings.h"
#include "common/config/config.h"
#include "common/logging.h"
#include "common/usable_cores.h"
#include "dtrain/common/error.h"
#include "ps/roles.h"
#include "report/timeline.h"

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
  m.def("usable_cores", &UsableCores,
        "The cores this process may keep busy: the machine's, its affinity mask's or its cgroup's "
        "CPU quota (a pod's limit), whichever is fewest.");
  m.def("timeline_enabled", &timeline::Enabled);
  m.def("timeline_start", &timeline::Start, py::arg("path"),
        "Records the timeline from now into `path` (written by timeline_stop or at exit).");
  m.def("timeline_stop", &timeline::Stop, "Writes the timeline timeline_start began.");
  m.def(
      "timeline_span",
      [](const std::string& name, double begin_s, double end_s, int64_t step) {
        using std::chrono::duration_cast;
        const auto at = [](double s) {
          return timeline::TimePoint(
              duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(s)));
        };
        // The recorder keeps the name's pointer: only the Trainer's own names, as literals.
        const char* literal = name == "forward"    ? "forward"
                              : name == "backward" ? "backward"
                                                   : nullptr;
        if (literal == nullptr) throw InvalidArgument("timeline_span: unknown span '" + name + "'");
        timeline::Complete(literal, "train", at(begin_s), at(end_s),
                           timeline::Args().Int("step", step));
      },
      "A training span of the Python Trainer (times from time.time()).");
}

}  // namespace dtrain::python

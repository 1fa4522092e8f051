// _dtrain.collectives_*: allreduce mode (Horovod's API) on the C++ collectives engine. The
// Python side (dtrain/torch/) keeps Horovod's names, handles and argument forms.
#include <pybind11/stl.h>

#include "bindings.h"
#include "collectives/collectives_internal.h"
#include "dtrain/collectives/collectives.h"
#include "dtrain/common/error.h"
#include "tensor_array.h"

namespace py = pybind11;

namespace dtrain::python {
namespace {

namespace coll = dtrain::collectives;

std::string Quoted(const std::string& name) { return "'" + name + "'"; }

coll::ReduceOp ReduceOpNamed(const std::string& op) {
  if (op == "sum") return coll::ReduceOp::kSum;
  if (op == "average") return coll::ReduceOp::kAverage;
  if (op == "min") return coll::ReduceOp::kMin;
  if (op == "max") return coll::ReduceOp::kMax;
  if (op == "product") return coll::ReduceOp::kProduct;
  if (op == "adasum") return coll::ReduceOp::kAdasum;
  throw InvalidArgument("unknown reduction '" + op +
                        "' (sum, average, min, max, product or adasum)");
}

}  // namespace

void RegisterCollectives(py::module_& m) {
  py::class_<coll::Handle>(m, "CollectiveHandle", "A collective in flight.")
      .def("wait", &coll::Handle::Wait, py::call_guard<py::gil_scoped_release>(),
           "Blocks until the collective is done; raises its error (DTRAIN_COLLECTIVE_TIMEOUT_MS "
           "bounds it).")
      .def_property_readonly("done", &coll::Handle::done)
      .def(
          "result", [](const coll::Handle& h) { return TensorView(h.result()); },
          "The tensor an allgather, alltoall or reducescatter received (after wait).")
      .def("received_rows", &coll::Handle::received_rows,
           "An alltoall's rows from each rank, in rank order (after wait).");

  m.def("collectives_init", &coll::Init, py::call_guard<py::gil_scoped_release>());
  m.def("collectives_shutdown", &coll::Shutdown, py::call_guard<py::gil_scoped_release>());
  m.def("collectives_is_initialized", &coll::IsInitialized);
  m.def("collectives_is_elastic", &coll::IsElastic);
  m.def(
      "elastic_hosts_update",
      [](double timeout_s) {
        switch (coll::ElasticHostsUpdate(Duration(static_cast<int64_t>(timeout_s * 1000)))) {
          case coll::HostsUpdate::kNone:
            return "none";
          case coll::HostsUpdate::kRemoved:
            return "removed";
          case coll::HostsUpdate::kAdded:
            return "added";
        }
        return "none";
      },
      py::call_guard<py::gil_scoped_release>(), py::arg("timeout_s") = 10.0,
      "What changed since this worker's elastic membership formed: 'none', 'removed' (workers "
      "only left) or 'added'");
  m.def("elastic_note_rollback", &coll::NoteElasticRollback, py::arg("steps"),
        "The steps this worker redoes since its last commit, told to the launcher with its next "
        "join");
  m.def("collectives_backend",
        [] { return coll::Backend() == coll::BackendKind::kMpi ? "mpi" : "gloo"; });
  m.def("collectives_rank", &coll::Rank);
  m.def("collectives_size", &coll::Size);
  m.def("collectives_local_rank", &coll::LocalRank);
  m.def("collectives_local_size", &coll::LocalSize);
  m.def("nccl_built", &coll::NcclBuilt, "Whether dtrain was compiled with NCCL");
  m.def("nccl_version", &coll::NcclVersion,
        "NCCL_VERSION_CODE of the NCCL compiled against; 0 without NCCL");
  m.def("collectives_nccl_enabled", &coll::NcclEnabled,
        "Whether CUDA tensors go over NCCL (else they are staged through host memory)");
  py::class_<coll::SubmittedTogether>(
      m, "SubmittedTogether",
      "Holds the process set's collectives back until release(), which submits them together "
      "(one negotiation round, one fusion batch): Horovod's grouped collectives")
      .def(py::init<int>(), py::arg("process_set") = 0)
      .def("release", &coll::SubmittedTogether::release);
  m.def(
      "allreduce_async",
      [](const std::string& name, const at::Tensor& in, const at::Tensor& out,
         const std::string& op, int process_set) {
        const coll::ReduceOp reduce = ReduceOpNamed(op);
        const Array input = ArrayView(in, "the input of allreduce " + Quoted(name));
        const Array output = ArrayView(out, "the output of allreduce " + Quoted(name));
        py::gil_scoped_release no_gil;
        return coll::AllreduceAsync(name, input, output, reduce, 0, process_set);
      },
      py::arg("name"), py::arg("input"), py::arg("output"), py::arg("op"),
      py::arg("process_set") = 0);
  m.def(
      "alltoall_async",
      [](const std::string& name, const at::Tensor& in, const std::vector<int64_t>& splits,
         int process_set) {
        const Array input = ArrayView(in, "the input of alltoall " + Quoted(name));
        py::gil_scoped_release no_gil;
        return coll::AlltoallAsync(name, input, splits, process_set);
      },
      py::arg("name"), py::arg("input"), py::arg("splits"), py::arg("process_set") = 0);
  m.def(
      "reducescatter_async",
      [](const std::string& name, const at::Tensor& in, const std::string& op, int process_set) {
        const coll::ReduceOp reduce = ReduceOpNamed(op);
        const Array input = ArrayView(in, "the input of reducescatter " + Quoted(name));
        py::gil_scoped_release no_gil;
        return coll::ReducescatterAsync(name, input, reduce, process_set);
      },
      py::arg("name"), py::arg("input"), py::arg("op"), py::arg("process_set") = 0);
  m.def(
      "allgather_async",
      [](const std::string& name, const at::Tensor& in, int process_set) {
        const Array input = ArrayView(in, "the input of allgather " + Quoted(name));
        py::gil_scoped_release no_gil;
        return coll::AllgatherAsync(name, input, process_set);
      },
      py::arg("name"), py::arg("input"), py::arg("process_set") = 0);
  m.def(
      "broadcast_async",
      [](const std::string& name, const at::Tensor& inout, int root, int process_set) {
        const Array array = ArrayView(inout, "the tensor of broadcast " + Quoted(name));
        py::gil_scoped_release no_gil;
        return coll::BroadcastAsync(name, array, root, process_set);
      },
      py::arg("name"), py::arg("tensor"), py::arg("root"), py::arg("process_set") = 0);
  m.def("refuse_collective", &coll::RefuseName, py::arg("name"), py::arg("process_set"),
        "This rank refused its second collective of `name` itself: the other ranks' second one "
        "fails too");
  m.def("collectives_barrier", &coll::Barrier, py::call_guard<py::gil_scoped_release>(),
        py::arg("process_set") = 0);
  m.def("add_process_set", &coll::AddProcessSet, py::call_guard<py::gil_scoped_release>(),
        py::arg("ranks"), "A collective of the whole job: the new process set's id.");
  m.def("remove_process_set", &coll::RemoveProcessSet, py::call_guard<py::gil_scoped_release>(),
        py::arg("process_set"), "A collective of the whole job: whether the set existed.");
  m.def("process_set_ranks", &coll::ProcessSetRanks, py::arg("process_set"),
        "The set's members as ranks of the job, ascending.");
  m.def("process_set_ids", &coll::ProcessSetIds, "Every process set's id, 0 first.");
  m.def("join_async", &coll::JoinAsync, py::call_guard<py::gil_scoped_release>(),
        "Horovod's join; the handle's result() is the rank that joined last.");
}

}  // namespace dtrain::python

// _dtrain.ParameterSync (the engine of dtrain.torch.Trainer: the same one the C++ Trainer runs
// on) and the data-splitting helpers of dtrain.data.
#include <pybind11/stl.h>

#include <memory>

#include "bindings.h"
#include "dtrain/common/error.h"
#include "dtrain/train/data/dataset.h"
#include "dtrain/train/parameter_sync.h"
#include "kvstore_binding.h"

namespace py = pybind11;

namespace dtrain::python {
namespace {

// The sync and the store it uses, which it keeps alive. Closing waits for the exchanges in
// flight without the GIL.
class SyncHandle {
 public:
  SyncHandle(std::vector<std::vector<at::Tensor>> replicas, const KVStoreHandle& kv,
             train::TrainerOptions options)
      : store_(kv.store()) {
    py::gil_scoped_release no_gil;  // Init and the first pull are exchanges with the servers
    sync_ =
        std::make_unique<train::ParameterSync>(std::move(replicas), *store_, std::move(options));
  }
  ~SyncHandle() { Close(); }

  train::ParameterSync& sync() const {
    if (!sync_) throw InvalidArgument("the trainer was closed");
    return *sync_;
  }
  void Close() {
    if (!sync_) return;
    py::gil_scoped_release no_gil;
    sync_.reset();
    store_.reset();
  }

 private:
  std::shared_ptr<KVStore> store_;
  std::unique_ptr<train::ParameterSync> sync_;
};

}  // namespace

void RegisterTraining(py::module_& m) {
  py::class_<SyncHandle>(m, "ParameterSync")
      .def(py::init([](std::vector<std::vector<at::Tensor>> replicas, const KVStoreHandle& kv,
                       const std::string& optimizer, const std::map<std::string, double>& params,
                       const std::string& lr_scheduler, int64_t batch_size, bool update_on_kvstore,
                       bool overlap, int64_t fuse_below_bytes, int backward_passes_per_step) {
             train::TrainerOptions options;
             options.optimizer = OptimizerSpec{optimizer, params};
             options.optimizer.lr_scheduler = lr_scheduler;
             options.batch_size = batch_size;
             options.update_on_kvstore = update_on_kvstore;
             options.overlap = overlap;
             options.fuse_below_bytes = fuse_below_bytes;
             options.backward_passes_per_step = backward_passes_per_step;
             return std::make_unique<SyncHandle>(std::move(replicas), kv, std::move(options));
           }),
           py::arg("replicas"), py::arg("kvstore"), py::arg("optimizer"), py::arg("params"),
           py::arg("lr_scheduler"), py::arg("batch_size"), py::arg("update_on_kvstore"),
           py::arg("overlap"), py::arg("fuse_below_bytes"), py::arg("backward_passes_per_step"))
      .def("step",
           [](const SyncHandle& h, int64_t batch_size) {
             auto& sync = h.sync();
             py::gil_scoped_release no_gil;
             sync.Step(batch_size);
           })
      .def("stale_gradients", [](const SyncHandle& h) { return h.sync().StaleGradients(); })
      .def("wait_for",
           [](const SyncHandle& h, const std::vector<size_t>& indexes) {
             auto& sync = h.sync();
             py::gil_scoped_release no_gil;
             sync.WaitFor(indexes);
           })
      .def("wait_for_rows",
           [](const SyncHandle& h, size_t index, const at::Tensor& ids) {
             auto& sync = h.sync();
             py::gil_scoped_release no_gil;
             sync.WaitForRows(index, ids);
           })
      .def("wait_all",
           [](const SyncHandle& h) {
             auto& sync = h.sync();
             py::gil_scoped_release no_gil;
             sync.WaitAll();
           })
      .def_property(
          "learning_rate", [](const SyncHandle& h) { return h.sync().learning_rate(); },
          [](const SyncHandle& h, double lr) { h.sync().set_learning_rate(lr); })
      .def_property_readonly("batch_size",
                             [](const SyncHandle& h) { return h.sync().batch_size(); })
      .def_property_readonly("num_keys", [](const SyncHandle& h) { return h.sync().num_keys(); })
      .def("replicate_from_first",
           [](const SyncHandle& h) {
             auto& sync = h.sync();
             py::gil_scoped_release no_gil;
             sync.ReplicateFromFirst();
           })
      .def("save_optimizer_state",
           [](const SyncHandle& h) {
             auto& sync = h.sync();
             std::string state;
             {
               py::gil_scoped_release no_gil;
               state = sync.SaveOptimizerState();
             }
             return py::bytes(state);
           })
      .def("load_optimizer_state",
           [](const SyncHandle& h, const py::bytes& state) {
             std::string bytes = state;
             auto& sync = h.sync();
             py::gil_scoped_release no_gil;
             sync.LoadOptimizerState(bytes);
           })
      .def("close", &SyncHandle::Close);

  m.def(
      "split_sampler_indices",
      [](int64_t length, int num_parts, int part_index, uint64_t seed, bool shuffle, int epoch) {
        return train::SplitSampler(length, num_parts, part_index, seed, shuffle)
            .EpochIndices(epoch);
      },
      py::arg("length"), py::arg("num_parts"), py::arg("part_index"), py::arg("seed"),
      py::arg("shuffle"), py::arg("epoch"));
  m.def("default_update_on_kvstore", &train::DefaultUpdateOnKVStore, py::arg("store_type"),
        py::arg("cuda_parameters"));
  m.def("split_batch", &train::SplitBatch, py::arg("batch_size"), py::arg("num_devices"),
        py::arg("work_load") = std::vector<double>{});
}

}  // namespace dtrain::python

// _dtrain.KVStore and _dtrain.Operation: MXNet's KVStore over torch tensors (dtrain/kv.py wraps
// them with MXNet's names and argument forms).
#include "kvstore_binding.h"

#include <pybind11/stl.h>

#include "bindings.h"
#include "dtrain/common/error.h"
#include "kvstore/key_names.h"
#include "optim/optimizer.h"
#include "tensor_array.h"

namespace py = pybind11;

namespace dtrain::python {
namespace {

// An int key as it is, a str key by its name's hash (key_names.h).
Key KeyFrom(const py::handle& key) {
  if (py::isinstance<py::str>(key)) return KeyOfName(key.cast<std::string>());
  if (py::isinstance<py::bool_>(key) || !py::isinstance<py::int_>(key)) {
    throw py::type_error("a kvstore key is an int or a str, not " +
                         std::string(py::str(key.get_type().attr("__name__"))));
  }
  int overflow = 0;  // set for a value past 64 bits, which is out of range too
  const long long value = PyLong_AsLongLongAndOverflow(key.ptr(), &overflow);
  if (overflow != 0 || value < 0 || value >= kFirstNamedKey) {
    throw InvalidArgument("key " + std::string(py::str(key)) +
                          " is out of range: int keys must be in [0, 2^43)");
  }
  return static_cast<Key>(value);
}

std::vector<Key> KeysFrom(const py::list& keys) {
  std::vector<Key> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(KeyFrom(k));
  return out;
}

// Per key, the tensors given for it (one per local device), as Arrays.
std::vector<std::vector<Array>> ArraysFrom(const std::vector<Key>& keys,
                                           const std::vector<std::vector<at::Tensor>>& tensors,
                                           const char* what) {
  if (tensors.size() != keys.size()) {
    throw InvalidArgument(std::to_string(keys.size()) + " keys but " +
                          std::to_string(tensors.size()) + " " + what + " lists (one per key)");
  }
  std::vector<std::vector<Array>> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t d = 0; d < tensors[i].size(); ++d) {
      out[i].push_back(ArrayView(tensors[i][d], std::string(what) + " " + std::to_string(d) +
                                                    " of key " + KeyLabel(keys[i])));
    }
  }
  return out;
}

OptimizerSpec SpecFrom(const std::string& name, const std::map<std::string, double>& params,
                       const std::string& lr_scheduler) {
  OptimizerSpec spec{name, params};
  spec.lr_scheduler = lr_scheduler;
  return spec;
}

// Row ids of a row push or pull: integers, on the CPU, any shape (flattened).
std::vector<int64_t> RowIdsFrom(const at::Tensor& rows, Key key) {
  if (rows.is_floating_point() || rows.is_complex() || rows.scalar_type() == at::kBool) {
    throw InvalidArgument("rows of key " + KeyLabel(key) + ": row ids must be integers, not " +
                          std::string(c10::toString(rows.scalar_type())));
  }
  const at::Tensor ids = rows.reshape(-1).to(at::kCPU, at::kLong).contiguous();
  const int64_t* data = ids.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + ids.numel());
}

}  // namespace

KVStoreHandle::KVStoreHandle(const std::string& type) {
  py::gil_scoped_release no_gil;  // a dist store joins its job: up to DTRAIN_START_TIMEOUT_MS
  store_ = KVStore::Create(type);
}

const std::shared_ptr<KVStore>& KVStoreHandle::store() const {
  if (!store_) throw InvalidArgument("the kvstore was closed");
  return store_;
}

void KVStoreHandle::Close() {
  std::shared_ptr<KVStore> store = std::move(store_);
  if (!store) return;
  py::gil_scoped_release no_gil;  // leaving a job waits for the others (bounded)
  store.reset();
}

void RegisterKVStore(py::module_& m) {
  py::class_<Operation>(m, "Operation", "A kvstore call in flight.")
      .def("wait", py::overload_cast<>(&Operation::Wait, py::const_),
           py::call_guard<py::gil_scoped_release>(),
           "Blocks until the call is done; raises its error (DTRAIN_REQUEST_TIMEOUT_MS bounds it).")
      .def_property_readonly("done", &Operation::done);

  py::class_<KVStoreHandle>(m, "KVStore")
      .def(py::init<const std::string&>(), py::arg("type"))
      .def_property_readonly("type", [](const KVStoreHandle& h) { return h.store()->type(); })
      .def_property_readonly("rank", [](const KVStoreHandle& h) { return h.store()->rank(); })
      .def_property_readonly("num_workers",
                             [](const KVStoreHandle& h) { return h.store()->num_workers(); })
      .def_property_readonly("rounds_done",
                             [](const KVStoreHandle& h) { return h.store()->rounds_done(); })
      .def_property_readonly("rejoined",
                             [](const KVStoreHandle& h) { return h.store()->rejoined(); })
      .def("close", &KVStoreHandle::Close)
      .def_static("key_of", [](const py::handle& key) { return KeyFrom(key); })
      .def("init",
           [](const KVStoreHandle& h, const py::list& keys, const std::vector<at::Tensor>& values) {
             const std::vector<Key> ks = KeysFrom(keys);
             if (values.size() != ks.size()) {
               throw InvalidArgument("init: " + std::to_string(ks.size()) + " keys but " +
                                     std::to_string(values.size()) + " values");
             }
             std::vector<Array> arrays;
             for (size_t i = 0; i < ks.size(); ++i) {
               arrays.push_back(ArrayView(values[i], "value of key " + KeyLabel(ks[i])));
             }
             auto store = h.store();
             py::gil_scoped_release no_gil;
             store->Init(ks, arrays);
           })
      .def("push",
           [](const KVStoreHandle& h, const py::list& keys,
              const std::vector<std::vector<at::Tensor>>& values, int priority) {
             const std::vector<Key> ks = KeysFrom(keys);
             const auto arrays = ArraysFrom(ks, values, "value");
             auto store = h.store();
             py::gil_scoped_release no_gil;
             return store->Push(ks, arrays, priority);
           })
      .def("pull",
           [](const KVStoreHandle& h, const py::list& keys,
              const std::vector<std::vector<at::Tensor>>& outs, int priority) {
             const std::vector<Key> ks = KeysFrom(keys);
             const auto arrays = ArraysFrom(ks, outs, "out");
             auto store = h.store();
             py::gil_scoped_release no_gil;
             return store->Pull(ks, arrays, priority);
           })
      .def("pushpull",
           [](const KVStoreHandle& h, const py::list& keys,
              const std::vector<std::vector<at::Tensor>>& values,
              const std::vector<std::vector<at::Tensor>>& outs, int priority) {
             const std::vector<Key> ks = KeysFrom(keys);
             const auto in = ArraysFrom(ks, values, "value");
             const auto out = ArraysFrom(ks, outs, "out");
             auto store = h.store();
             py::gil_scoped_release no_gil;
             return store->PushPull(ks, in, out, priority);
           })
      .def("push_rows",
           [](const KVStoreHandle& h, const py::handle& key, const at::Tensor& rows,
              const at::Tensor& values, int priority) {
             const Key k = KeyFrom(key);
             std::vector<int64_t> ids = RowIdsFrom(rows, k);
             const Array array = ArrayView(values, "rows of key " + KeyLabel(k));
             auto store = h.store();
             py::gil_scoped_release no_gil;
             return store->PushRows(k, std::move(ids), array, priority);
           })
      .def("pull_rows",
           [](const KVStoreHandle& h, const py::handle& key, const at::Tensor& rows,
              const at::Tensor& out, int priority) {
             const Key k = KeyFrom(key);
             std::vector<int64_t> ids = RowIdsFrom(rows, k);
             const Array array = ArrayView(out, "rows out of key " + KeyLabel(k));
             auto store = h.store();
             py::gil_scoped_release no_gil;
             return store->PullRows(k, std::move(ids), array, priority);
           })
      .def("waitall",
           [](const KVStoreHandle& h) {
             auto store = h.store();
             py::gil_scoped_release no_gil;
             store->WaitAll();
           })
      .def("barrier",
           [](const KVStoreHandle& h) {
             auto store = h.store();
             py::gil_scoped_release no_gil;
             store->Barrier();
           })
      .def("set_optimizer",
           [](const KVStoreHandle& h, const std::string& name,
              const std::map<std::string, double>& params, const std::string& lr_scheduler) {
             const OptimizerSpec spec = SpecFrom(name, params, lr_scheduler);
             auto store = h.store();
             py::gil_scoped_release no_gil;
             store->SetOptimizer(spec);
           })
      .def("set_gradient_compression",
           [](const KVStoreHandle& h, const std::map<std::string, std::string>& params) {
             h.store()->SetGradientCompression(params);
           })
      .def("save_optimizer_state",
           [](const KVStoreHandle& h) {
             auto store = h.store();
             std::string state;
             {
               py::gil_scoped_release no_gil;
               state = store->SaveOptimizerState();
             }
             return py::bytes(state);
           })
      .def("load_optimizer_state", [](const KVStoreHandle& h, const py::bytes& state) {
        std::string bytes = state;
        auto store = h.store();
        py::gil_scoped_release no_gil;
        store->LoadOptimizerState(bytes);
      });

  m.def(
      "check_optimizer",
      [](const std::string& name, const std::map<std::string, double>& params,
         const std::string& lr_scheduler) {
        CreateOptimizer(SpecFrom(name, params, lr_scheduler));
      },
      "Raises InvalidArgument naming what is wrong with an optimizer's name or parameters.");
}

}  // namespace dtrain::python

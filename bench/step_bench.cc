// An emulated training step across a job, for bench/cluster_bench.sh: the step's compute is
// emulated (--compute-ms, asleep or busy, standing in for an accelerator) and its gradients have
// the real parameter shapes of a well-known model (model_shapes.h, scaled by --scale so that the
// links, not this machine's CPU, are the bottleneck). They go through the KVStore as in real
// training: forward takes a third of the compute, then backward produces the gradients last layer
// first, each pushed (pushpull) as soon as it exists, with MXNet's priority -index (the layers
// nearest the input first). With --overlap (the default, as MXNet's engine and BytePS run) the
// next forward starts each layer as soon as that layer's new value is back, so the tail of the
// communication overlaps the next step; without it a step waits for every value first (as
// DDP's optimizer step does). step_ms is the time from one step's start to the next one's.
//
// Run on every worker of a job; rank 0 prints one JSON line:
//   mode, workers, servers, link_mbit, model, scale, params, bytes, compute_ms, step_ms (median),
//   p90_ms, idle_ms (median time a step's emulated device stood waiting for values),
//   idle_first_ms (the part of it before the first layer), bound_ms, samples_per_s, efficiency,
//   placement (the key placement and fusion variables rank 0 got)
// efficiency = compute_ms / step_ms: one worker alone takes compute_ms per step, so N workers at
// this efficiency train N * efficiency times as fast.
// bound_ms = the larger of compute_ms and the bytes through the busiest link at the link's rate,
// by --layout:
//   colocated  a server on every worker's host (S = N): each host sends and receives
//              2 * bytes * (N - 1) / N (its pushes to the other servers and their answers, and the
//              same for its own server's share)
//   separate   servers on hosts of their own: a worker's link carries `bytes` each way, a server's
//              bytes * N / S
//   ring       allreduce: 2 * bytes * (H - 1) / H each way per host, H = N / --ranks-per-host
//              hosts (with several ranks a host, a host's ranks can reduce among themselves first)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/kvstore/kvstore.h"
#include "dtrain/optim/optimizer.h"
#include "model_shapes.h"
#include "percentile.h"

namespace {

using dtrain::bench::Percentile;

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::duration<double, std::milli>;

// The emulated accelerator: compute runs on its own clock, so that the wake-up delay of each of
// hundreds of short per-layer sleeps does not add up (it did: 232 ms for a 200 ms step alone, 200
// ms with this clock); only a wait for the network moves the clock on.
class Compute {
 public:
  explicit Compute(bool busy) : busy_(busy) {}
  void Spend(double ms) {
    due_ += std::chrono::duration_cast<Clock::duration>(Ms(ms));
    if (!busy_) return std::this_thread::sleep_until(due_);
    while (Clock::now() < due_) {
    }
  }
  // Waits for op; returns how long the emulated device stood idle for it (ms).
  double Wait(const dtrain::Operation& op) {
    if (op.done()) return 0;
    op.Wait();
    const auto now = Clock::now();
    const double idle = std::max(0.0, Ms(now - due_).count());
    due_ = std::max(due_, now);
    return idle;
  }

 private:
  const bool busy_;
  Clock::time_point due_ = Clock::now();
};

// The settings that decide how keys are placed, cut and fused, as this process got them (null:
// unset), so that a run shows what reached its jobs (cluster_bench.sh scales them with the model).
nlohmann::json PlacementSettings() {
  nlohmann::json settings = nlohmann::json::object();
  for (const char* name : {"MXNET_KVSTORE_BIGARRAY_BOUND", "DTRAIN_PARTITION_BYTES",
                           "DTRAIN_CHUNK_BYTES", "HOROVOD_FUSION_THRESHOLD"}) {
    const char* value = std::getenv(name);
    settings[name] = value ? nlohmann::json(value) : nlohmann::json(nullptr);
  }
  return settings;
}

// The communication bound of one step, in ms (see the file's comment).
double LinkBoundMs(const std::string& layout, double bytes, int workers, int servers,
                   double link_mbit, int ranks_per_host) {
  if (link_mbit <= 0) return 0;
  const double n = workers;
  double busiest = 0;
  if (layout == "ring") {
    const double hosts = std::max(1, workers / ranks_per_host);
    busiest = 2 * bytes * (hosts - 1) / hosts;
  } else if (layout == "colocated") {
    busiest = 2 * bytes * (n - 1) / n;
  } else if (layout == "separate") {
    busiest = std::max(bytes, bytes * n / std::max(1, servers));
  } else {
    throw dtrain::InvalidArgument("--layout must be colocated, separate or ring, not " + layout);
  }
  return busiest * 8 / (link_mbit * 1e6) * 1e3;
}

int64_t ScaledElements(const dtrain::bench::ParameterTensor& t, double scale) {
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(t.elements) * scale));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"an emulated training step: real layer shapes, emulated compute"};
  std::string model = "resnet50", kvstore = "dist_sync", layout = "colocated", compute = "sleep";
  double scale = 1.0, compute_ms = 100, link_mbit = 0;
  int steps = 10, warmup = 2, batch = 32;
  app.add_option("--model", model, "lenet, mlp, resnet18, resnet50, vgg16, bert-base");
  app.add_option("--scale", scale, "multiply every tensor's size by this");
  app.add_option("--kvstore", kvstore, "dist_sync, dist_async or horovod");
  app.add_option("--compute-ms", compute_ms, "emulated forward+backward time per step");
  app.add_option("--compute", compute, "sleep or busy");
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--batch", batch, "samples per worker per step (for samples_per_s)");
  app.add_option("--link-mbit", link_mbit, "each host's link rate, for bound_ms (0: none)");
  app.add_option("--layout", layout, "colocated, separate or ring, for bound_ms");
  int ranks_per_host = 1;
  app.add_option("--ranks-per-host", ranks_per_host, "workers per host (ring layout), for bound_ms")
      ->check(CLI::PositiveNumber);
  bool overlap = true;
  app.add_flag("--overlap,!--no-overlap", overlap,
               "start each layer's next forward when its value is back (default), or wait for all");
  std::string optimizer;
  app.add_option("--optimizer", optimizer,
                 "the servers update the weights with this (OptimizerSpec JSON, e.g. "
                 "'{\"name\": \"sgd\", \"params\": {\"momentum\": 0.9}}'); default: they only sum");
  bool print_shapes = false;
  app.add_flag("--print-shapes", print_shapes,
               "print the scaled tensors as JSON and exit (bench/ddp_step.py uses them)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (print_shapes) {
      nlohmann::json tensors = nlohmann::json::array();
      for (const auto& t : dtrain::bench::ModelParameters(model)) {
        tensors.push_back({{"name", t.name}, {"elements", ScaledElements(t, scale)}});
      }
      std::cout << tensors.dump() << std::endl;
      return 0;
    }
    const bool busy = compute == "busy";
    if (!busy && compute != "sleep") throw dtrain::InvalidArgument("--compute: sleep or busy");
    std::vector<dtrain::Array> params, grads;
    int64_t total = 0;
    auto kv = dtrain::KVStore::Create(kvstore);
    std::vector<int64_t> sizes;
    for (const auto& t : dtrain::bench::ModelParameters(model)) {
      sizes.push_back(ScaledElements(t, scale));
      total += sizes.back();
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      params.emplace_back(std::vector<int64_t>{sizes[k]});
      grads.emplace_back(std::vector<int64_t>{sizes[k]});
      params.back().Fill(0.0f);
      grads.back().Fill(1e-3f);
      kv->Init(static_cast<dtrain::Key>(k), params.back());
    }
    if (!optimizer.empty()) kv->SetOptimizer(dtrain::OptimizerSpec::FromJson(optimizer));
    kv->Barrier();
    const double forward_ms = compute_ms / 3;
    const double backward_ms = compute_ms - forward_ms;
    auto share = [&](size_t k) {
      return static_cast<double>(sizes[k]) / static_cast<double>(total);
    };
    std::vector<dtrain::Operation> updated(sizes.size());  // each layer's pushpull of the last step
    std::vector<Clock::time_point> starts;
    // Per measured step: how long the device stood idle waiting for values, before the first
    // layer and in all (where a step loses its time: the urgent first layers or the bulk).
    std::vector<double> idle_first_ms, idle_ms;
    Compute device(busy);
    for (int s = 0; s < warmup + steps; ++s) {
      starts.push_back(Clock::now());
      double idle_first = 0, idle = 0;
      for (size_t k = 0; k < sizes.size(); ++k) {  // forward: first layer first
        if (overlap) idle += device.Wait(updated[k]);
        if (k == 0) idle_first = idle;
        device.Spend(forward_ms * share(k));
      }
      for (size_t k = sizes.size(); k-- > 0;) {  // backward: last layer first
        device.Spend(backward_ms * share(k));
        updated[k] = kv->PushPull(static_cast<dtrain::Key>(k), {grads[k]}, {params[k]},
                                  -static_cast<int>(k));
      }
      if (!overlap) {
        for (auto& op : updated) idle += device.Wait(op);
      }
      if (s >= warmup) {  // a step's forward waits for the last step's values
        idle_first_ms.push_back(idle_first);
        idle_ms.push_back(idle);
      }
    }
    for (auto& op : updated) op.Wait();
    starts.push_back(Clock::now());
    std::vector<double> step_ms;
    for (size_t s = warmup; s + 1 < starts.size(); ++s) {
      step_ms.push_back(Ms(starts[s + 1] - starts[s]).count());
    }
    kv->Barrier();
    if (kv->rank() == 0) {
      const char* servers_env = std::getenv("DMLC_NUM_SERVER");
      const int servers = servers_env ? std::atoi(servers_env) : 0;
      const int workers = kv->num_workers();
      const double bytes = static_cast<double>(total) * sizeof(float);
      const double median = Percentile(step_ms, 0.5);
      nlohmann::json line = {
          {"mode", kvstore == "horovod" ? "horovod" : kvstore},
          {"workers", workers},
          {"servers", servers},
          {"ranks_per_host", ranks_per_host},
          {"link_mbit", link_mbit},
          {"model", model},
          {"scale", scale},
          {"params", total},
          {"bytes", bytes},
          {"compute_ms", compute_ms},
          {"overlap", overlap},
          {"optimizer",
           optimizer.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(optimizer)},
          {"step_ms", median},
          {"p90_ms", Percentile(step_ms, 0.9)},
          {"idle_ms", idle_ms.empty() ? 0 : Percentile(idle_ms, 0.5)},
          {"idle_first_ms", idle_first_ms.empty() ? 0 : Percentile(idle_first_ms, 0.5)},
          {"bound_ms", std::max(compute_ms, LinkBoundMs(layout, bytes, workers, servers, link_mbit,
                                                        ranks_per_host))},
          {"samples_per_s", workers * batch / (median / 1e3)},
          {"efficiency", compute_ms / median},
          {"placement", PlacementSettings()}};
      std::cout << line.dump() << std::endl;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "step_bench: " << e.what() << "\n";
    return 1;
  }
}

// Allreduce latency and bus bandwidth: the plain backends against the dtrain engine on top of them.
//
// One process is one rank; bench/allreduce_bench.sh starts the job (mpirun for MPI, N processes
// for Gloo) and prints the table. Rank 0 prints one JSON line per case:
//   {"bench":"allreduce","backend":"mpi","impl":"mpi_allreduce"|"plain"|"engine",...}
//   {"bench":"fusion",...}: 100 tensors of 64 KB through the engine vs 100 plain calls
// Bus bandwidth is 2(n-1)/n * bytes / time, the rate each rank's link carries in a ring
// allreduce (NCCL's definition), so numbers for different rank counts compare.
//
//   allreduce_bench [--phases mpi_allreduce,plain,engine,fusion] [--max-mb 256] [--min-kb 4]
//                   [--repeats 3] [--seconds-per-case 0.15]
//   allreduce_bench --table results.jsonl        the table with ratios, from the JSON lines
//   allreduce_bench --free-port                  a free TCP port on 127.0.0.1, for the script
//
// The machine may be busy with other work: each case is measured in --repeats sweeps that
// alternate the implementations, and the median is over every iteration of every sweep.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <asio.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/backend.h"
#include "collectives/config.h"
#include "collectives/engine/engine.h"

namespace {

namespace coll = dtrain::collectives;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::string> phases = {"mpi_allreduce", "plain", "engine", "fusion"};
  int64_t min_kb = 4;
  int64_t max_mb = 256;
  double seconds_per_case = 0.15;  // iterations are chosen to take about this long
  int repeats = 3;
  std::string label;  // free text carried into the JSON (e.g. "mpi-tcp")
  std::string table;
  bool free_port = false;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Times `op` (microseconds per iteration, on this rank), with a barrier before each iteration.
// The number of iterations follows from a few warm-up runs and Options::seconds_per_case; every
// rank must run as many, so rank 0's count is the one used (`agree` broadcasts it).
std::vector<double> Time(const Options& o, const std::function<void()>& barrier,
                         const std::function<void()>& op, const std::function<void(int*)>& agree) {
  auto once = [&] {
    barrier();
    const auto t0 = Clock::now();
    op();
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  };
  std::vector<double> warmup;
  for (int i = 0; i < 2; ++i) warmup.push_back(once());
  int iterations = static_cast<int>(o.seconds_per_case * 1e6 / std::max(Median(warmup), 1.0));
  iterations = std::clamp(iterations, 3, 300);
  agree(&iterations);
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) times.push_back(once());
  return times;
}

std::vector<size_t> Sizes(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t b = static_cast<size_t>(o.min_kb) << 10; b <= static_cast<size_t>(o.max_mb) << 20;
       b *= 4) {
    sizes.push_back(b);
  }
  return sizes;
}

// Samples of every case, pooled over the repeats; printed (rank 0) once all repeats are done.
class Results {
 public:
  Results(coll::Communicator& comm, const coll::CollectivesConfig& config, const Options& o)
      : comm_(comm), config_(config), o_(o) {}

  void Add(const std::string& bench, const std::string& impl, size_t bytes,
           const std::vector<double>& times, double data_calls = -1) {
    Case& c = cases_[{bench, impl, bytes}];
    c.times.insert(c.times.end(), times.begin(), times.end());
    if (data_calls >= 0) c.data_calls = data_calls;
  }

  void Print() const {
    if (comm_.rank() != 0) return;
    const int n = comm_.size();
    for (const auto& [key, c] : cases_) {
      const auto& [bench, impl, bytes] = key;
      json j = {{"bench", bench},
                {"backend", coll::BackendName(comm_.kind())},
                {"impl", impl},
                {"ranks", n},
                {"iterations", c.times.size()},
                {"median_us", Median(c.times)}};
      if (comm_.kind() == coll::BackendKind::kGloo) {
        j["algorithm"] = config_.gloo_algorithm.empty() ? "auto" : config_.gloo_algorithm;
      }
      if (!o_.label.empty()) j["label"] = o_.label;
      if (bench == "allreduce") {
        j["bytes"] = bytes;
        j["busbw_GBps"] = 2.0 * (n - 1) / n * static_cast<double>(bytes) / (Median(c.times) * 1e3);
      } else {
        j["tensors"] = kFusionTensors;
        j["tensor_bytes"] = bytes;
        if (c.data_calls >= 0) j["data_calls_per_round"] = c.data_calls;
      }
      std::printf("%s\n", j.dump().c_str());
    }
    std::fflush(stdout);
  }

  static constexpr int kFusionTensors = 100;

 private:
  struct Case {
    std::vector<double> times;
    double data_calls = -1;
  };
  coll::Communicator& comm_;
  const coll::CollectivesConfig& config_;
  const Options& o_;
  std::map<std::tuple<std::string, std::string, size_t>, Case> cases_;
};

int RunJob(const Options& o) {
  const coll::CollectivesConfig config = coll::CollectivesConfig::FromEnvironment();
  std::shared_ptr<coll::Communicator> comm(coll::CreateBackend(config));
  const bool mpi = comm->kind() == coll::BackendKind::kMpi;
  auto has = [&](const char* phase) {
    return std::find(o.phases.begin(), o.phases.end(), phase) != o.phases.end();
  };
  auto plain_barrier = [&] { comm->Barrier(); };
  auto plain_agree = [&](int* v) { comm->Broadcast(v, sizeof(*v), 0); };
  const auto sizes = Sizes(o);
  std::vector<float> buffer(sizes.empty() ? 0 : sizes.back() / 4, 1.0f);
  constexpr int kTensors = Results::kFusionTensors;
  constexpr int64_t kTensorFloats = 64 * 1024 / 4;
  std::vector<dtrain::Array> tensors;
  for (int t = 0; t < kTensors; ++t) tensors.emplace_back(dtrain::Shape{kTensorFloats});
  Results results(*comm, config, o);

  // Repeats alternate the implementations, so that a burst of load from elsewhere on the machine
  // does not land on one implementation only.
  for (int repeat = 0; repeat < o.repeats; ++repeat) {
    for (size_t bytes : sizes) {
      const size_t count = bytes / 4;
      if (mpi && has("mpi_allreduce")) {
        results.Add("allreduce", "mpi_allreduce", bytes,
                    Time(
                        o, plain_barrier,
                        [&] {
                          MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(count),
                                        MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                        },
                        plain_agree));
      }
      if (has("plain")) {
        results.Add("allreduce", "plain", bytes,
                    Time(
                        o, plain_barrier,
                        [&] {
                          comm->Allreduce(buffer.data(), buffer.data(), count,
                                          dtrain::DType::kFloat32, coll::ReduceOp::kSum);
                        },
                        plain_agree));
      }
    }
    if (has("fusion")) {
      results.Add("fusion", "plain", kTensorFloats * 4,
                  Time(
                      o, plain_barrier,
                      [&] {
                        for (auto& t : tensors) {
                          comm->Allreduce(t.data(), t.data(), kTensorFloats,
                                          dtrain::DType::kFloat32, coll::ReduceOp::kSum);
                        }
                      },
                      plain_agree));
    }
    if (!has("engine") && !has("fusion")) continue;
    coll::Engine engine(comm, config);
    auto engine_barrier = [&] { engine.Barrier().Wait(); };
    dtrain::Array agreed({1});
    auto engine_agree = [&](int* v) {
      agreed.floats()[0] = static_cast<float>(*v);
      engine.Broadcast("bench.agree", agreed, 0).Wait();
      *v = static_cast<int>(agreed.floats()[0]);
    };
    if (has("engine")) {
      for (size_t bytes : sizes) {
        dtrain::Array a = dtrain::Array::Wrap(buffer.data(), {static_cast<int64_t>(bytes / 4)},
                                              dtrain::DType::kFloat32, nullptr);
        const std::string name = "bench." + std::to_string(bytes);
        results.Add(
            "allreduce", "engine", bytes,
            Time(
                o, engine_barrier,
                [&] { engine.Allreduce(name, a, a, coll::ReduceOp::kSum).Wait(); }, engine_agree));
      }
    }
    if (has("fusion")) {
      std::vector<coll::Handle> handles(kTensors);
      const auto before = engine.stats();
      auto times = Time(
          o, engine_barrier,
          [&] {
            for (int t = 0; t < kTensors; ++t) {
              handles[t] = engine.Allreduce("fusion." + std::to_string(t), tensors[t], tensors[t],
                                            coll::ReduceOp::kSum);
            }
            for (auto& h : handles) h.Wait();
          },
          engine_agree);
      const auto after = engine.stats();
      // Backend calls that moved data per round of 100 (warm-up rounds included): fusion at work.
      const double calls = static_cast<double>(after.data_calls - before.data_calls) /
                           static_cast<double>(times.size() + 2);
      results.Add("fusion", "engine", kTensorFloats * 4, times, calls);
    }
    engine.Shutdown();
  }
  results.Print();
  return 0;
}

std::string Bytes(size_t b) {
  if (b >= (1u << 20)) return std::to_string(b >> 20) + " MB";
  return std::to_string(b >> 10) + " KB";
}

// Reads the JSON lines of a run and prints, per size, each implementation's median time and bus
// bandwidth, and the engine's ratio to the plain call of its backend.
int PrintTable(const std::string& path) {
  std::ifstream in(path);
  std::map<size_t, std::map<std::string, json>> rows;  // bytes -> column -> line
  std::vector<std::string> columns;
  std::vector<json> fusion;
  std::string text;
  while (std::getline(in, text)) {
    if (text.empty() || text[0] != '{') continue;
    json j = json::parse(text);
    if (j["bench"] == "fusion") {
      fusion.push_back(j);
      continue;
    }
    std::string column = j["backend"].get<std::string>() + " " + j["impl"].get<std::string>();
    if (j.contains("algorithm") && j["impl"] == "plain")
      column += " " + j["algorithm"].get<std::string>();
    if (j.contains("label")) column += " [" + j["label"].get<std::string>() + "]";
    if (std::find(columns.begin(), columns.end(), column) == columns.end())
      columns.push_back(column);
    rows[j["bytes"].get<size_t>()][column] = j;
  }
  std::printf("\nAllreduce, float32, median time (us) and bus bandwidth (GB/s):\n%-8s", "size");
  for (const auto& c : columns) std::printf(" | %-30s", c.c_str());
  std::printf(" | engine/plain\n");
  for (const auto& [bytes, cols] : rows) {
    std::printf("%-8s", Bytes(bytes).c_str());
    for (const auto& c : columns) {
      auto it = cols.find(c);
      if (it == cols.end()) {
        std::printf(" | %-30s", "-");
        continue;
      }
      std::ostringstream cell;
      cell.precision(1);
      cell << std::fixed << it->second["median_us"].get<double>() << " us, ";
      cell.precision(2);
      cell << it->second["busbw_GBps"].get<double>() << " GB/s";
      std::printf(" | %-30s", cell.str().c_str());
    }
    // engine time / plain time of the same backend (plain: the default gloo algorithm's run).
    std::string ratios;
    for (const char* backend : {"mpi", "gloo"}) {
      const json* engine = nullptr;
      const json* plain = nullptr;
      for (const auto& [c, j] : cols) {
        if (j["backend"] != backend || j.contains("label")) continue;
        if (j["impl"] == "engine") engine = &j;
        if (j["impl"] == "plain" && (!j.contains("algorithm") || j["algorithm"] == "auto")) {
          plain = &j;
        }
      }
      if (engine && plain) {
        char r[64];
        std::snprintf(r, sizeof(r), "%s%s %.2f", ratios.empty() ? "" : ", ", backend,
                      (*engine)["median_us"].get<double>() / (*plain)["median_us"].get<double>());
        ratios += r;
      }
    }
    std::printf(" | %s\n", ratios.c_str());
  }
  if (!fusion.empty()) {
    std::printf("\n100 allreduces of 64 KB submitted together, median time per round (us):\n");
    // One line per backend and label (gloo's default and "tcp").
    std::vector<std::pair<std::string, std::string>> runs;
    for (const auto& j : fusion) {
      std::pair<std::string, std::string> run{j["backend"], j.value("label", "")};
      if (std::find(runs.begin(), runs.end(), run) == runs.end()) runs.push_back(run);
    }
    for (const auto& [backend, label] : runs) {
      double plain = 0, engine = 0, calls = 0;
      for (const auto& j : fusion) {
        if (j["backend"] != backend || j.value("label", "") != label) continue;
        (j["impl"] == "plain" ? plain : engine) = j["median_us"].get<double>();
        if (j.contains("data_calls_per_round")) calls = j["data_calls_per_round"].get<double>();
      }
      if (plain > 0 && engine > 0) {
        const std::string name = label.empty() ? backend : backend + " [" + label + "]";
        std::printf(
            "%-10s  100 plain calls %10.1f us | engine %10.1f us (%.1f backend calls per "
            "round) | speed-up %.2fx\n",
            name.c_str(), plain, engine, calls, plain / engine);
      }
    }
  }
  return 0;
}

int PrintFreePort() {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  std::printf("%u\n", static_cast<unsigned>(acceptor.local_endpoint().port()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("allreduce_bench: plain MPI/Gloo allreduce vs the dtrain engine (one rank)");
  Options o;
  app.add_option("--phases", o.phases, "mpi_allreduce, plain, engine, fusion")->delimiter(',');
  app.add_option("--min-kb", o.min_kb, "smallest size");
  app.add_option("--max-mb", o.max_mb, "largest size (sizes grow 4x from --min-kb)");
  app.add_option("--seconds-per-case", o.seconds_per_case, "per case and repeat");
  app.add_option("--repeats", o.repeats, "sweeps, alternating the implementations");
  app.add_option("--label", o.label);
  app.add_option("--table", o.table, "print the table of a file of JSON lines and exit");
  app.add_flag("--free-port", o.free_port, "print a free TCP port on 127.0.0.1 and exit");
  CLI11_PARSE(app, argc, argv);
  if (o.free_port) return PrintFreePort();
  try {
    return o.table.empty() ? RunJob(o) : PrintTable(o.table);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
}

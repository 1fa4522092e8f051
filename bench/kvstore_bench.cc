// KVStore throughput and latency: push, pull and pushpull of one key of each size.
//
// Run on every worker of a job (see kvstore_bench.sh); rank 0 prints one JSON line per case:
//   {"op":"pushpull","bytes":16777216,"workers":2,"servers":2,"median_ms":..,"p90_ms":..,...}
// Each iteration is timed from the call to the end of Wait(), on every worker at once (in
// dist_sync a push completes when the round of all workers is applied, so this is the time of a
// synchronous step's communication).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "compression/codec.h"
#include "dtrain/common/error.h"
#include "dtrain/kvstore/init.h"
#include "dtrain/kvstore/kvstore.h"
#include "percentile.h"

namespace {

using dtrain::bench::Percentile;

using Clock = std::chrono::steady_clock;

// ps-lite (the C++ parameter server over ZeroMQ that MXNet uses, commit 15b8adf on Debian's
// ZeroMQ): pushpull median times measured side by side with dtrain on this machine type's loopback,
// as issue 13 gives them (the middle of each measured range; 2x2 with dist_sync semantics). They
// replace the figures of issue 2, which were partly wrong (1 MB 0.46, 16 MB 11.3).
// {workers, servers, bytes} -> ms.
struct Reference {
  int workers, servers;
  size_t bytes;
  double ms;
};
constexpr Reference kPsLite[] = {
    {1, 1, 4096, 0.16}, {1, 1, 1 << 20, 0.74},  {1, 1, 16 << 20, 16.1},  {1, 1, 64 << 20, 96.5},
    {2, 2, 4096, 0.23}, {2, 2, 1 << 20, 0.965}, {2, 2, 16 << 20, 19.45}, {2, 2, 64 << 20, 134.0}};

int Iterations(size_t bytes, double seconds_budget) {
  // Enough samples for a stable median without making the 64 MB cases take minutes.
  const double est_ms = 0.1 + static_cast<double>(bytes) / 1.0e6;  // ~1 GB/s worst case
  return std::clamp(static_cast<int>(seconds_budget * 1000 / est_ms), 10, 2000);
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::Initialize();
  CLI::App app{"dtrain KVStore benchmark"};
  std::string kvstore = "dist_sync";
  std::vector<size_t> sizes = {4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  std::vector<std::string> ops = {"push", "pull", "pushpull"};
  double budget = 2.0;
  int warmup = 3;
  app.add_option("--kvstore", kvstore);
  app.add_option("--bytes", sizes, "value sizes in bytes")->delimiter(',');
  app.add_option("--ops", ops)->delimiter(',');
  app.add_option("--seconds", budget, "rough time budget per case");
  app.add_option("--warmup", warmup);
  bool samples = false;
  app.add_flag("--samples", samples, "also print every iteration's time (samples_ms), in order");
  std::string gc_type = "none";
  std::string gc_threshold;
  app.add_option("--gc-type", gc_type, "gradient compression of pushes: none, 2bit, 1bit, fp16");
  app.add_option("--gc-threshold", gc_threshold, "its threshold (default: the type's)");
  CLI11_PARSE(app, argc, argv);

  try {
    auto kv = dtrain::KVStore::Create(kvstore);
    std::map<std::string, std::string> gc{{"type", gc_type}};
    if (!gc_threshold.empty()) gc["threshold"] = gc_threshold;
    kv->SetGradientCompression(gc);
    const dtrain::CompressionSpec spec = dtrain::CompressionSpec::FromParams(gc);
    const char* servers = std::getenv("DMLC_NUM_SERVER");
    dtrain::Key key = 0;
    for (size_t bytes : sizes) {
      const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
      dtrain::Array value({n});
      value.Fill(1.0f);
      dtrain::Array out({n});
      for (const std::string& op : ops) {
        kv->Init(key, value);
        // Every worker runs the same number of iterations (dist_sync rounds need all of them).
        const int iters = Iterations(bytes, budget);
        std::vector<double> ms;
        for (int i = 0; i < warmup + iters; ++i) {
          const auto start = Clock::now();
          if (op == "push") {
            kv->Push(key, {value}).Wait();
          } else if (op == "pull") {
            kv->Pull(key, {out}).Wait();
          } else {
            kv->PushPull(key, {value}, {out}).Wait();
          }
          const double elapsed =
              std::chrono::duration<double, std::milli>(Clock::now() - start).count();
          if (i >= warmup) ms.push_back(elapsed);
        }
        kv->Barrier();
        if (kv->rank() == 0) {
          const double median = Percentile(ms, 0.5);
          // Bytes moved per worker: push and pull move the value once, pushpull twice.
          const double moved = static_cast<double>(bytes) * (op == "pushpull" ? 2 : 1);
          nlohmann::json line = {{"op", op},
                                 {"bytes", bytes},
                                 {"workers", kv->num_workers()},
                                 {"servers", servers ? std::atoi(servers) : 0},
                                 {"kvstore", kvstore},
                                 {"iterations", iters},
                                 {"median_ms", median},
                                 {"p90_ms", Percentile(ms, 0.9)},
                                 {"min_ms", Percentile(ms, 0.0)},
                                 {"gbytes_per_s", moved / (median * 1e-3) / 1e9},
                                 {"gc_type", gc_type},
                                 // What one push puts on the wire (bodies only).
                                 {"push_wire_bytes", dtrain::CompressedBytes(spec.type, n)}};
          for (const auto& ref : kPsLite) {
            if (op == "pushpull" && ref.bytes == bytes && ref.workers == kv->num_workers() &&
                servers && ref.servers == std::atoi(servers)) {
              line["pslite_median_ms"] = ref.ms;
              line["ratio_vs_pslite"] = median / ref.ms;
            }
          }
          if (samples) line["samples_ms"] = ms;
          const char* same_host = std::getenv("DTRAIN_SAME_HOST");
          line["transport"] = same_host && std::string(same_host) == "0" ? "tcp" : "tcp+same-host";
          std::printf("%s\n", line.dump().c_str());
          std::fflush(stdout);
        }
        ++key;
      }
    }
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "kvstore_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

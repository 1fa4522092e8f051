// Speed of gradient compression's codecs (compression/codec.h) on one core: GB/s of
// float32 input for compress (with the residual's error feedback) and for decompress, plain and
// accumulating (a server summing pushes), and the plain float32 sum for comparison (memory bound).
// One JSON line per case:
//   {"bench":"codec","op":"compress","type":"2bit","bytes":16777216,"gbytes_per_s":..,"ns_per_value":..}
//
//   build/bench/compression_codec_bench [--mb 1,16,64] [--seconds 0.5]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "common/elementwise.h"
#include "compression/codec.h"
#include "dtrain/common/array.h"

namespace {

using Clock = std::chrono::steady_clock;

// Runs `f` until `seconds` have passed (at least 3 times); the best time of one run.
double BestSeconds(const std::function<void()>& f, double seconds) {
  double best = 1e30;
  const auto start = Clock::now();
  for (int i = 0; i < 3 || std::chrono::duration<double>(Clock::now() - start).count() < seconds;
       ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void Print(const char* op, const char* type, size_t n, double secs) {
  nlohmann::json j{{"bench", "codec"},
                   {"op", op},
                   {"type", type},
                   {"bytes", n * 4},
                   {"gbytes_per_s", static_cast<double>(n) * 4 / secs / 1e9},
                   {"ns_per_value", secs * 1e9 / static_cast<double>(n)}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gradient compression codec speed, one core"};
  std::vector<size_t> mbs = {1, 16, 64};
  double seconds = 0.5;
  app.add_option("--mb", mbs, "float32 input sizes in MiB")->delimiter(',');
  app.add_option("--seconds", seconds, "time per case");
  CLI11_PARSE(app, argc, argv);

  for (size_t mb : mbs) {
    const size_t n = mb << 18;  // float32 values in mb MiB
    std::vector<float> grad(n), residual(n, 0.0f), out(n);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& g : grad) g = normal(rng);
    Print("sum_float32", "none", n,
          BestSeconds(
              [&] {
                dtrain::AddInto(out.data(), grad.data(), static_cast<int64_t>(n),
                                dtrain::DType::kFloat32);
              },
              seconds));
    for (auto type :
         {dtrain::Compression::kTwoBit, dtrain::Compression::kOneBit, dtrain::Compression::kFp16}) {
      const dtrain::CompressionSpec spec{type, dtrain::CompressionSpec::DefaultThreshold(type)};
      const char* name = dtrain::CompressionName(type).data();
      std::vector<char> packed(dtrain::CompressedBytes(type, static_cast<int64_t>(n)));
      Print("compress", name, n,
            BestSeconds(
                [&] {
                  dtrain::Compress(spec, grad.data(), residual.data(), static_cast<int64_t>(n),
                                   packed.data());
                },
                seconds));
      Print("decompress", name, n,
            BestSeconds(
                [&] {
                  dtrain::Decompress(spec, packed.data(), static_cast<int64_t>(n), out.data(),
                                     false);
                },
                seconds));
      Print("decompress_add", name, n,
            BestSeconds(
                [&] {
                  dtrain::Decompress(spec, packed.data(), static_cast<int64_t>(n), out.data(),
                                     true);
                },
                seconds));
    }
  }
  return 0;
}

// What the dist compression tests share: a job with small slots, so that keys of a few thousand
// elements are split over every server, and random gradients that any worker can recompute.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "dtrain/compression/compression_spec.h"
#include "inprocess_job.h"

namespace dtrain::testing {

// Keys of over 1000 elements are split over the servers, in slots of 1024 bytes (256 floats).
inline Config SmallSlots(int servers, int workers) {
  Config c = InMemoryJobConfig(servers, workers);
  c.bigarray_bound = 1000;
  c.chunk_bytes = 1024;
  return c;
}

// Worker `rank`'s gradient in `step`: random, but the same wherever it is computed. For fp16,
// multiples of 1/8, whose sums are exact in any order.
inline std::vector<float> Gradient(int rank, int step, int64_t n, Compression type) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * rank + step));
  std::normal_distribution<float> normal(0.0f, 0.7f);
  std::vector<float> g(n);
  for (auto& v : g) {
    v = normal(rng);
    if (type == Compression::kFp16) v = std::round(v * 8);
  }
  return g;
}

// Every worker's quantizer for each key, simulated here (residuals included): what the servers'
// sums of the workers' compressed Gradient()s must be, bit for bit.
class SimulatedQuantizers {
 public:
  SimulatedQuantizers(const CompressionSpec& spec, int workers, const std::vector<int64_t>& sizes)
      : spec_(spec), sizes_(sizes), residuals_(workers) {
    for (auto& worker : residuals_) {
      for (int64_t size : sizes) worker.emplace_back(size, 0.0f);
    }
  }
  // The sum of `step` for key `k` (call once per step and key, in order).
  std::vector<float> Sum(int step, size_t k) {
    const int64_t size = sizes_[k];
    std::vector<float> sum(size, 0.0f);
    std::vector<char> packed(CompressedBytes(spec_.type, size));
    for (size_t w = 0; w < residuals_.size(); ++w) {
      const auto g = Gradient(static_cast<int>(w), step, size, spec_.type);
      Compress(spec_, g.data(), residuals_[w][k].data(), size, packed.data());
      Decompress(spec_, packed.data(), size, sum.data(), /*accumulate=*/true);
    }
    return sum;
  }

 private:
  CompressionSpec spec_;
  std::vector<int64_t> sizes_;
  std::vector<std::vector<std::vector<float>>> residuals_;  // worker, key, element
};

struct Layout {
  int workers;
  int servers;
};

inline std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  return std::to_string(info.param.workers) + "workers" + std::to_string(info.param.servers) +
         "servers";
}

}  // namespace dtrain::testing

// The p-th percentile (0..1) of a benchmark's samples, nearest rank: what every bench here reports
// as median_ms and p90_ms.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dtrain::bench {

inline double Percentile(std::vector<double> samples, double p) {
  std::sort(samples.begin(), samples.end());
  const size_t last = samples.size() - 1;
  return samples[std::min(last, static_cast<size_t>(p * static_cast<double>(last) + 0.5))];
}

}  // namespace dtrain::bench

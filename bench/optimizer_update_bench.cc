// The optimizers' host update, as a server applies it to a big key: nanoseconds per element of
// Optimizer::Update for each rule and variant on 2.4 M float32 weights (one of ResNet-18's big
// convolutions), median of 40 updates after a first one, on one thread; and, as the bound, the
// rate of a memcpy of the same bytes in the same run.
//
//   build/bench/optimizer_update_bench
//
// One JSON line per case: rule, params, ns_per_element, gb_per_s (bytes each update reads and
// writes: the weight, the gradient and the rule's state), memcpy_gb_per_s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  using dtrain::OptimizerSpec;
  constexpr size_t kElements = 2359296;  // 512 x 512 x 3 x 3
  constexpr int kRounds = 40;
  struct Case {
    OptimizerSpec spec;
    int arrays;  // float arrays each update reads and writes: weight, gradient, state buffers
  };
  const Case cases[] = {
      {{"sgd", {{"learning_rate", 0.05}, {"wd", 1e-4}}}, 2},
      {{"sgd", {{"learning_rate", 0.05}, {"momentum", 0.9}, {"wd", 1e-4}}}, 3},
      {{"nag", {{"learning_rate", 0.05}, {"momentum", 0.9}, {"clip_gradient", 1}}}, 3},
      {{"adam", {{"learning_rate", 0.001}}}, 4},
      {{"adam", {{"learning_rate", 0.001}, {"clip_gradient", 1}}}, 4},
      {{"adagrad", {{"learning_rate", 0.01}}}, 3},
      {{"rmsprop", {{"learning_rate", 0.001}, {"clip_gradient", 1}, {"clip_weights", 2}}}, 3},
      {{"rmsprop", {{"learning_rate", 0.001}, {"centered", 1}}}, 5},
  };
  std::vector<float> weight(kElements, 0.5f), grad(kElements, 0.01f), copy(kElements);
  std::vector<double> memcpy_s;
  for (int i = 0; i < kRounds; ++i) {
    const auto start = Clock::now();
    std::memcpy(copy.data(), weight.data(), kElements * sizeof(float));
    memcpy_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  // A memcpy reads and writes each byte once.
  const double memcpy_rate = 2.0 * kElements * sizeof(float) / MedianOf(memcpy_s) / 1e9;
  for (const Case& c : cases) {
    auto optimizer = dtrain::CreateOptimizer(c.spec);
    optimizer->Update(0, weight, grad);  // the state is allocated here
    std::vector<double> seconds;
    for (int i = 0; i < kRounds; ++i) {
      const auto start = Clock::now();
      optimizer->Update(0, weight, grad);
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double s = MedianOf(seconds);
    std::string params;
    for (const auto& [name, value] : c.spec.params) {
      params += (params.empty() ? "" : ",") + name + "=" + std::to_string(value);
    }
    // State buffers are read and written; the gradient is only read.
    const double bytes = (2.0 * (c.arrays - 1) + 1) * kElements * sizeof(float);
    std::printf(
        "{\"rule\": \"%s\", \"params\": \"%s\", \"ns_per_element\": %.3f, \"gb_per_s\": %.1f, "
        "\"memcpy_gb_per_s\": %.1f}\n",
        c.spec.name.c_str(), params.c_str(), s * 1e9 / kElements, bytes / s / 1e9, memcpy_rate);
  }
  return 0;
}

// Helpers shared by the optimizer tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "optim/optimizer.h"
#include "support/invalid_argument_from.h"

namespace dtrain::optim_test {

using test_support::InvalidArgumentFrom;

inline std::vector<float> RandomVector(std::mt19937& rng, size_t n, float scale = 1.f) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// mshadow's clip for the references below (no NaN in the tests).
inline float Clip(float x, float bound) { return std::max(-bound, std::min(bound, x)); }

// Bit-for-bit equality, with the first difference in the message.
inline ::testing::AssertionResult SameBits(const std::vector<float>& a,
                                           const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " vs " << b[i] << " (of " << a.size() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

inline void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                       double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
  }
}

// One spec of every optimizer and variant, with every option on, for the tests that hold for all.
struct NamedSpec {
  std::string label;
  OptimizerSpec spec;
};

inline std::vector<NamedSpec> EveryVariant() {
  return {
      {"SgdPlainStepSchedule",
       {"sgd",
        {{"learning_rate", 0.05},
         {"wd", 0.01},
         {"lr_step", 3},
         {"lr_factor", 0.5},
         {"lr_warmup_steps", 2},
         {"lr_warmup_begin", 0.01}},
        "step"}},
      {"SgdMomentumClip",
       {"sgd",
        {{"learning_rate", 0.05},
         {"momentum", 0.9},
         {"wd", 0.01},
         {"rescale_grad", 0.5},
         {"clip_gradient", 0.8}}}},
      {"Nag",
       {"nag",
        {{"learning_rate", 0.05},
         {"momentum", 0.9},
         {"wd", 0.01},
         {"clip_gradient", 0.8},
         {"lr_max_update", 7}},
        "cosine"}},
      {"Adam",
       {"adam",
        {{"learning_rate", 0.01},
         {"beta1", 0.8},
         {"beta2", 0.99},
         {"epsilon", 1e-6},
         {"wd", 0.01},
         {"rescale_grad", 0.5},
         {"clip_gradient", 0.7},
         {"lr_max_update", 6},
         {"lr_warmup_steps", 2}},
        "cosine"}},
      {"AdaGrad",
       {"adagrad",
        {{"learning_rate", 0.1},
         {"eps", 1e-6},
         {"wd", 0.01},
         {"rescale_grad", 0.5},
         {"clip_gradient", 0.7},
         {"lr_step", 2},
         {"lr_factor", 0.9}},
        "step"}},
      {"RmsProp",
       {"rmsprop",
        {{"learning_rate", 0.01},
         {"gamma1", 0.8},
         {"epsilon", 1e-6},
         {"wd", 0.01},
         {"rescale_grad", 0.5},
         {"clip_gradient", 0.7},
         {"clip_weights", 1.5}}}},
      {"RmsPropCentered",
       {"rmsprop",
        {{"learning_rate", 0.01},
         {"gamma1", 0.8},
         {"gamma2", 0.7},
         {"centered", 1},
         {"epsilon", 1e-6},
         {"wd", 0.01},
         {"rescale_grad", 0.5},
         {"clip_gradient", 0.7},
         {"clip_weights", 1.5},
         {"lr_step", 4},
         {"lr_factor", 0.5}},
        "step"}},
  };
}

// Runs `opt` and `ref` (a reference implementation with Step(w, g)) side by side on 37 weights
// (37: vector loops and a tail) for 30 steps of random gradients from `seed`; every step must give
// the same bits.
template <typename Reference>
void ExpectSameBitsAsReference(Optimizer& opt, Reference& ref, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<float> w = RandomVector(rng, 37), w_ref = w;
  for (int step = 0; step < 30; ++step) {
    const std::vector<float> g = RandomVector(rng, w.size());
    opt.Update(5, w, g);
    ref.Step(w_ref, g);
    ASSERT_TRUE(SameBits(w, w_ref)) << "step " << step;
  }
}

}  // namespace dtrain::optim_test

// Adam against hand-computed steps and a scalar reference written from MXNet's formulas (the
// Python update's bias correction in double, adam_update's kernel in float32), bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"

namespace dtrain {
namespace {

using optim_test::Clip;
using optim_test::ExpectNear;
using optim_test::ExpectSameBitsAsReference;
using optim_test::SameBits;

std::unique_ptr<Optimizer> Adam(std::map<std::string, double> params) {
  return CreateOptimizer({"adam", std::move(params)});
}

struct AdamOptions {
  double lr = 0.001, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8, wd = 0, rescale = 1, clip = -1;
};

// MXNet 1.x: Adam.update (Python floats) then AdamUpdateKernel (float32), operation by operation.
struct AdamReference {
  AdamOptions o;
  std::vector<float> m = {}, v = {};
  uint64_t t = 0;

  void Step(std::vector<float>& w, const std::vector<float>& grad) {
    if (m.empty()) m.assign(w.size(), 0.f), v.assign(w.size(), 0.f);
    ++t;
    const double coef1 = 1. - std::pow(o.beta1, static_cast<double>(t));
    const double coef2 = 1. - std::pow(o.beta2, static_cast<double>(t));
    const float lr = static_cast<float>(o.lr * (std::sqrt(coef2) / coef1));
    const float beta1 = static_cast<float>(o.beta1), beta2 = static_cast<float>(o.beta2);
    const float eps = static_cast<float>(o.epsilon), wd = static_cast<float>(o.wd);
    const float rescale = static_cast<float>(o.rescale), clip = static_cast<float>(o.clip);
    for (size_t i = 0; i < w.size(); ++i) {
      float g = grad[i] * rescale + w[i] * wd;
      if (clip > 0) g = Clip(g, clip);
      m[i] = beta1 * m[i] + (1.f - beta1) * g;
      v[i] = beta2 * v[i] + (1.f - beta2) * g * g;
      w[i] = w[i] - lr * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
};

TEST(AdamTest, DefaultsAreMxnets) {
  auto opt = Adam({});
  EXPECT_DOUBLE_EQ(opt->learning_rate(), 0.001);
  // With a constant gradient the bias-corrected step is lr each time (epsilon aside).
  std::vector<float> w{1.f, -1.f};
  for (int i = 1; i <= 3; ++i) {
    opt->Update(0, w, std::vector<float>{0.5f, -4.f});
    ExpectNear(w, {1.0 - 0.001 * i, -1.0 + 0.001 * i}, 1e-5);
  }
}

TEST(AdamTest, HandComputedStepsWithALargeEpsilon) {
  // lr 0.1, beta1 0.5, beta2 0.75, epsilon 1, g = 1 twice:
  // t=1: m = 0.5, v = 0.25, lr_t = 0.1*sqrt(0.25)/0.5 = 0.1; w -= 0.1*0.5/(0.5+1) = 1/30.
  // t=2: m = 0.75, v = 0.4375, lr_t = 0.1*sqrt(0.4375)/0.75; w -= lr_t*0.75/(sqrt(0.4375)+1).
  auto opt = Adam({{"learning_rate", 0.1}, {"beta1", 0.5}, {"beta2", 0.75}, {"epsilon", 1}});
  std::vector<float> w{1.f};
  opt->Update(0, w, std::vector<float>{1.f});
  ExpectNear(w, {1.0 - 1.0 / 30});
  opt->Update(0, w, std::vector<float>{1.f});
  const double lr2 = 0.1 * std::sqrt(0.4375) / 0.75;
  ExpectNear(w, {1.0 - 1.0 / 30 - lr2 * 0.75 / (std::sqrt(0.4375) + 1)});
}

TEST(AdamTest, WeightDecayIsClippedWithTheGradient) {
  // MXNet's kernel clips rescale*grad + wd*weight, all of it: with w = 10, wd = 1, grad = 0 and
  // clip 0.1, g = 0.1 (not 10). lr 1, epsilon 1: step = sqrt(0.001)/0.1 * 0.01/(sqrt(1e-5) + 1).
  auto opt = Adam({{"learning_rate", 1}, {"wd", 1}, {"clip_gradient", 0.1}, {"epsilon", 1}});
  std::vector<float> w{10.f};
  opt->Update(0, w, std::vector<float>{0.f});
  const double step = std::sqrt(0.001) / 0.1 * 0.01 / (std::sqrt(1e-5) + 1);
  ExpectNear(w, {10.0 - step});
}

TEST(AdamTest, ManyStepsMatchTheReferenceBitForBit) {
  const std::vector<AdamOptions> cases = {
      {},
      {0.01, 0.8, 0.99, 1e-6, 0, 1, -1},
      {0.01, 0.9, 0.999, 1e-8, 0.01, 0.5, -1},
      {0.02, 0.9, 0.999, 1e-8, 0.01, 2, 0.5},
      {0.05, 0, 0, 1e-3, 0.1, 1.0 / 32, 0.02},  // betas 0: no averaging, no bias correction
  };
  for (const AdamOptions& o : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "lr " << o.lr << " beta1 " << o.beta1 << " beta2 " << o.beta2 << " eps "
                 << o.epsilon << " wd " << o.wd << " rescale " << o.rescale << " clip " << o.clip);
    auto opt = Adam({{"learning_rate", o.lr},
                     {"beta1", o.beta1},
                     {"beta2", o.beta2},
                     {"epsilon", o.epsilon},
                     {"wd", o.wd},
                     {"rescale_grad", o.rescale},
                     {"clip_gradient", o.clip}});
    AdamReference ref{o};
    ExpectSameBitsAsReference(*opt, ref, 7);
  }
}

TEST(AdamTest, BiasCorrectionCountsEachIndexsOwnUpdates) {
  auto opt = Adam({{"learning_rate", 0.01}});
  AdamReference late{{0.01}};
  std::vector<float> a{1.f}, b{1.f}, b_ref{1.f};
  for (int i = 0; i < 10; ++i) opt->Update(1, a, std::vector<float>{0.3f});
  // Index 2's first update is its t = 1, whatever index 1 has done.
  opt->Update(2, b, std::vector<float>{0.3f});
  late.Step(b_ref, {0.3f});
  EXPECT_TRUE(SameBits(b, b_ref));
}

TEST(AdamTest, BadParametersAreRefused) {
  for (const auto& [param, value] :
       std::vector<std::pair<std::string, double>>{{"beta1", 1.0},
                                                   {"beta1", -0.1},
                                                   {"beta2", 1.0},
                                                   {"beta2", 0.99999999},
                                                   {"epsilon", -1},
                                                   {"wd", -1},
                                                   {"rescale_grad", 0},
                                                   {"momentum", 0.9}}) {
    SCOPED_TRACE(param);
    EXPECT_THROW(Adam({{param, value}}), InvalidArgument);
  }
}

}  // namespace
}  // namespace dtrain

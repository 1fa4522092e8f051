// RMSProp, plain and centered, against hand-computed steps and scalar references written from
// MXNet's rmsprop_update and rmspropalex_update kernels (float32), bit for bit.
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

std::unique_ptr<Optimizer> RmsProp(std::map<std::string, double> params) {
  return CreateOptimizer({"rmsprop", std::move(params)});
}

struct RmsPropOptions {
  double lr = 0.001, gamma1 = 0.9, gamma2 = 0.9, epsilon = 1e-8, wd = 0, rescale = 1, clip = -1,
         clip_weights = -1;
  bool centered = false;
};

// MXNet 1.x RMSPropUpdateKernel and RMSPropAlexUpdateKernel, operation by operation.
struct RmsPropReference {
  RmsPropOptions o;
  std::vector<float> n = {}, g_avg = {}, delta = {};

  void Step(std::vector<float>& w, const std::vector<float>& grad) {
    if (n.empty()) n.assign(w.size(), 0.f), g_avg = n, delta = n;
    const float lr = static_cast<float>(o.lr), gamma1 = static_cast<float>(o.gamma1);
    const float gamma2 = static_cast<float>(o.gamma2), eps = static_cast<float>(o.epsilon);
    const float wd = static_cast<float>(o.wd), rescale = static_cast<float>(o.rescale);
    const float clip = static_cast<float>(o.clip), clip_w = static_cast<float>(o.clip_weights);
    for (size_t i = 0; i < w.size(); ++i) {
      float g = rescale * grad[i] + wd * w[i];
      if (clip > 0) g = Clip(g, clip);
      float weight;
      if (o.centered) {
        n[i] = (1.f - gamma1) * g * g + gamma1 * n[i];
        g_avg[i] = (1.f - gamma1) * g + gamma1 * g_avg[i];
        delta[i] = gamma2 * delta[i] - (lr * g / std::sqrt(n[i] - g_avg[i] * g_avg[i] + eps));
        weight = w[i] + delta[i];
      } else {
        n[i] = (1.f - gamma1) * (g * g) + gamma1 * n[i];
        weight = w[i] - lr * (g / std::sqrt(n[i] + eps));
      }
      if (clip_w > 0) weight = Clip(weight, clip_w);
      w[i] = weight;
    }
  }
};

TEST(RmsPropTest, DefaultsAreMxnets) {
  // lr 0.001, gamma1 0.9, g = 1: n = 0.1; w -= 0.001/sqrt(0.1).
  auto opt = RmsProp({});
  EXPECT_DOUBLE_EQ(opt->learning_rate(), 0.001);
  std::vector<float> w{1.f};
  opt->Update(0, w, std::vector<float>{1.f});
  ExpectNear(w, {1.0 - 0.001 / std::sqrt(0.1)});
}

TEST(RmsPropTest, HandComputedPlainSteps) {
  // lr 0.1, gamma1 0.5, g = 2: n = 2, 3; w -= 0.1*2/sqrt(n).
  auto opt = RmsProp({{"learning_rate", 0.1}, {"gamma1", 0.5}});
  std::vector<float> w{1.f};
  opt->Update(0, w, std::vector<float>{2.f});
  ExpectNear(w, {1.0 - 0.2 / std::sqrt(2.0)});
  opt->Update(0, w, std::vector<float>{2.f});
  ExpectNear(w, {1.0 - 0.2 / std::sqrt(2.0) - 0.2 / std::sqrt(3.0)});
}

TEST(RmsPropTest, HandComputedCenteredSteps) {
  // lr 0.1, gamma1 0.5, gamma2 0.5, g = 2:
  // t=1: n = 2, gbar = 1, delta = -0.2/sqrt(2 - 1) = -0.2.
  // t=2: n = 3, gbar = 1.5, delta = -0.1 - 0.2/sqrt(3 - 2.25) = -0.1 - 0.2/sqrt(0.75).
  auto opt = RmsProp({{"learning_rate", 0.1}, {"gamma1", 0.5}, {"gamma2", 0.5}, {"centered", 1}});
  std::vector<float> w{1.f};
  opt->Update(0, w, std::vector<float>{2.f});
  ExpectNear(w, {0.8});
  opt->Update(0, w, std::vector<float>{2.f});
  ExpectNear(w, {0.8 - 0.1 - 0.2 / std::sqrt(0.75)}, 1e-5);
}

TEST(RmsPropTest, WeightsAreClipped) {
  for (double centered : {0.0, 1.0}) {
    auto opt = RmsProp({{"learning_rate", 1}, {"clip_weights", 0.5}, {"centered", centered}});
    std::vector<float> w{0.4f, -0.4f, 0.f};
    opt->Update(0, w,
                std::vector<float>{-1.f, 1.f, 0.f});  // steps of about 3: clipped to the bound
    EXPECT_EQ(w, (std::vector<float>{0.5f, -0.5f, 0.f})) << "centered " << centered;
  }
}

TEST(RmsPropTest, WeightDecayIsClippedWithTheGradient) {
  // w = 10, wd 1, grad 0, clip 0.1: g = 0.1 (not 10). lr 1, gamma1 0.5, epsilon 1:
  // n = 0.005; w -= 0.1/sqrt(1.005).
  auto opt = RmsProp(
      {{"learning_rate", 1}, {"wd", 1}, {"clip_gradient", 0.1}, {"gamma1", 0.5}, {"epsilon", 1}});
  std::vector<float> w{10.f};
  opt->Update(0, w, std::vector<float>{0.f});
  ExpectNear(w, {10.0 - 0.1 / std::sqrt(1.005)});
}

TEST(RmsPropTest, ManyStepsMatchTheReferenceBitForBit) {
  std::vector<RmsPropOptions> cases;
  for (bool centered : {false, true}) {
    cases.push_back({.centered = centered});
    cases.push_back({0.01, 0.8, 0.7, 1e-6, 0, 1, -1, -1, centered});
    cases.push_back({0.01, 0.9, 0.9, 1e-8, 0.01, 0.5, -1, -1, centered});
    cases.push_back({0.02, 0.9, 0.95, 1e-8, 0.01, 2, 0.5, 0.8, centered});
    cases.push_back({0.05, 0.0, 0.0, 1e-3, 0.1, 1.0 / 32, 0.02, 2, centered});
  }
  for (const RmsPropOptions& o : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "lr " << o.lr << " gamma1 " << o.gamma1 << " gamma2 " << o.gamma2 << " eps "
                 << o.epsilon << " wd " << o.wd << " rescale " << o.rescale << " clip " << o.clip
                 << " clip_weights " << o.clip_weights << " centered " << o.centered);
    auto opt = RmsProp({{"learning_rate", o.lr},
                        {"gamma1", o.gamma1},
                        {"gamma2", o.gamma2},
                        {"epsilon", o.epsilon},
                        {"wd", o.wd},
                        {"rescale_grad", o.rescale},
                        {"clip_gradient", o.clip},
                        {"clip_weights", o.clip_weights},
                        {"centered", o.centered ? 1 : 0}});
    RmsPropReference ref{o};
    ExpectSameBitsAsReference(*opt, ref, 13);
  }
}

TEST(RmsPropTest, BadParametersAreRefused) {
  for (const auto& [param, value] :
       std::vector<std::pair<std::string, double>>{{"gamma1", 1.0},
                                                   {"gamma1", -0.5},
                                                   {"gamma2", 1.0},
                                                   {"epsilon", -1},
                                                   {"centered", 2},
                                                   {"wd", -1},
                                                   {"rescale_grad", -1},
                                                   {"eps", 1e-8}}) {
    SCOPED_TRACE(param);
    EXPECT_THROW(RmsProp({{param, value}}), InvalidArgument);
  }
}

}  // namespace
}  // namespace dtrain

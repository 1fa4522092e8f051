// AdaGrad against hand-computed steps and a scalar reference written from MXNet's dense update
// (float32 array operations), bit for bit.
#include <gmock/gmock.h>
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
using optim_test::InvalidArgumentFrom;
using optim_test::SameBits;
using ::testing::HasSubstr;

std::unique_ptr<Optimizer> AdaGrad(std::map<std::string, double> params) {
  return CreateOptimizer({"adagrad", std::move(params)});
}

struct AdaGradOptions {
  double lr = 0.01, eps = 1e-7, wd = 0, rescale = 1, clip = -1;
};

// MXNet 1.x AdaGrad.update, dense: grad * rescale_grad; clip; history += square(grad);
// div = grad / sqrt(history + eps); weight += (div + weight * wd) * -lr.
struct AdaGradReference {
  AdaGradOptions o;
  std::vector<float> history = {};

  void Step(std::vector<float>& w, const std::vector<float>& grad) {
    if (history.empty()) history.assign(w.size(), 0.f);
    const float lr = static_cast<float>(o.lr), eps = static_cast<float>(o.eps);
    const float wd = static_cast<float>(o.wd), rescale = static_cast<float>(o.rescale);
    const float clip = static_cast<float>(o.clip);
    for (size_t i = 0; i < w.size(); ++i) {
      float g = grad[i] * rescale;
      if (clip > 0) g = Clip(g, clip);
      history[i] += g * g;
      const float div = g / std::sqrt(history[i] + eps);
      w[i] += (div + w[i] * wd) * -lr;
    }
  }
};

TEST(AdaGradTest, HandComputedSteps) {
  // lr 0.1, g = 1: history 1, 2, 3; w -= 0.1/sqrt(history) (eps 1e-7 is lost in float32).
  auto opt = AdaGrad({{"learning_rate", 0.1}});
  std::vector<float> w{1.f};
  opt->Update(0, w, std::vector<float>{1.f});
  ExpectNear(w, {0.9});
  opt->Update(0, w, std::vector<float>{1.f});
  ExpectNear(w, {0.9 - 0.1 / std::sqrt(2.0)});
  opt->Update(0, w, std::vector<float>{1.f});
  ExpectNear(w, {0.9 - 0.1 / std::sqrt(2.0) - 0.1 / std::sqrt(3.0)});
}

TEST(AdaGradTest, DefaultLearningRateIsMxnets) {
  auto opt = AdaGrad({});
  EXPECT_DOUBLE_EQ(opt->learning_rate(), 0.01);
  std::vector<float> w{1.f};
  opt->Update(0, w, std::vector<float>{-2.f});
  ExpectNear(w, {1.01});
}

TEST(AdaGradTest, WeightDecayBypassesTheScalingAndIsNotClipped) {
  // w = 10, wd 0.5, grad 4 clipped to 1, lr 0.1, eps 1: history 1;
  // w -= 0.1 * (1/sqrt(1 + 1) + 0.5*10).
  auto opt = AdaGrad({{"learning_rate", 0.1}, {"wd", 0.5}, {"clip_gradient", 1}, {"eps", 1}});
  std::vector<float> w{10.f};
  opt->Update(0, w, std::vector<float>{4.f});
  ExpectNear(w, {10.0 - 0.1 * (1 / std::sqrt(2.0) + 5.0)});
}

TEST(AdaGradTest, EpsilonIsAnAliasOfEps) {
  auto with_eps = AdaGrad({{"learning_rate", 0.1}, {"eps", 0.5}});
  auto with_epsilon = AdaGrad({{"learning_rate", 0.1}, {"epsilon", 0.5}});
  std::vector<float> a{1.f}, b{1.f};
  with_eps->Update(0, a, std::vector<float>{1.f});
  with_epsilon->Update(0, b, std::vector<float>{1.f});
  ExpectNear(a, {1.0 - 0.1 / std::sqrt(1.5)});
  EXPECT_TRUE(SameBits(a, b));
  EXPECT_THAT(InvalidArgumentFrom([] {
                AdaGrad({{"eps", 0.5}, {"epsilon", 0.5}});
              }),
              HasSubstr("eps and epsilon are two names for one parameter"));
}

TEST(AdaGradTest, ManyStepsMatchTheReferenceBitForBit) {
  const std::vector<AdaGradOptions> cases = {
      {},
      {0.1, 1e-6, 0, 1, -1},
      {0.05, 1e-7, 0.01, 0.5, -1},
      {0.05, 1e-7, 0.01, 2, 0.5},
      {0.2, 0, 0.001, 1.0 / 32, 0.02},
  };
  for (const AdaGradOptions& o : cases) {
    SCOPED_TRACE(::testing::Message() << "lr " << o.lr << " eps " << o.eps << " wd " << o.wd
                                      << " rescale " << o.rescale << " clip " << o.clip);
    auto opt = AdaGrad({{"learning_rate", o.lr},
                        {"eps", o.eps},
                        {"wd", o.wd},
                        {"rescale_grad", o.rescale},
                        {"clip_gradient", o.clip}});
    AdaGradReference ref{o};
    ExpectSameBitsAsReference(*opt, ref, 9);
  }
}

TEST(AdaGradTest, BadParametersAreRefused) {
  for (const auto& [param, value] : std::vector<std::pair<std::string, double>>{
           {"eps", -1e-7}, {"epsilon", -1}, {"wd", -1}, {"rescale_grad", 0}, {"beta1", 0.9}}) {
    SCOPED_TRACE(param);
    EXPECT_THROW(AdaGrad({{param, value}}), InvalidArgument);
  }
}

}  // namespace
}  // namespace dtrain

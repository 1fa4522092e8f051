// SGD against hand-computed values and against a double-precision reference written from MXNet's
// formulas; per-index state; concurrent updates; the element-wise property the servers rely on.
#include "optim/rules/sgd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

std::unique_ptr<Optimizer> Sgd(std::map<std::string, double> params) {
  return CreateOptimizer({"sgd", std::move(params)});
}

// Updates `w` in place and returns a copy of the new weights.
std::vector<float> Step(Optimizer& opt, std::vector<float>& w, const std::vector<float>& g,
                        uint64_t index = 0) {
  opt.Update(index, w, g);
  return w;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
  }
}

// ---- Hand-computed steps ----

TEST(SgdTest, PlainStep) {
  auto opt = Sgd({{"learning_rate", 0.1}});
  std::vector<float> w{1.f, -2.f};
  ExpectNear(Step(*opt, w, {0.5f, 4.f}), {0.95, -2.4});
  ExpectNear(Step(*opt, w, {0.5f, 4.f}), {0.90, -2.8});
}

TEST(SgdTest, DefaultLearningRateIsMxnets) {
  auto opt = Sgd({});
  EXPECT_NEAR(opt->learning_rate(), 0.01, 1e-9);
  std::vector<float> w{1.f};
  ExpectNear(Step(*opt, w, {1.f}), {0.99});
}

TEST(SgdTest, MomentumSteps) {
  // mom = 0.9*mom - 0.1*g; w += mom, with g = 1: mom -0.1, -0.19, -0.271.
  auto opt = Sgd({{"learning_rate", 0.1}, {"momentum", 0.9}});
  std::vector<float> w{1.f};
  ExpectNear(Step(*opt, w, {1.f}), {0.9});
  ExpectNear(Step(*opt, w, {1.f}), {0.71});
  ExpectNear(Step(*opt, w, {1.f}), {0.439});
}

TEST(SgdTest, NesterovSteps) {
  // Textbook NAG: M = 0.9*M + g; w -= 0.1*(g + 0.9*M), with g = 1: M 1, 1.9, 2.71.
  auto opt = Sgd({{"learning_rate", 0.1}, {"momentum", 0.9}, {"nesterov", 1}});
  std::vector<float> w{1.f};
  ExpectNear(Step(*opt, w, {1.f}), {0.81});
  ExpectNear(Step(*opt, w, {1.f}), {0.539});
  ExpectNear(Step(*opt, w, {1.f}), {0.1951});
}

TEST(SgdTest, WeightDecay) {
  // w -= 0.1*(g + 0.5*w): 2 -> 1.8 -> 1.61.
  auto opt = Sgd({{"learning_rate", 0.1}, {"wd", 0.5}});
  std::vector<float> w{2.f};
  ExpectNear(Step(*opt, w, {1.f}), {1.8});
  ExpectNear(Step(*opt, w, {1.f}), {1.61});
}

TEST(SgdTest, WeightDecayWithMomentum) {
  // mom = 0.5*mom - 0.1*(g + 0.5*w); w += mom. Step 1: mom = -0.2, w = 1.8.
  // Step 2: mom = -0.1 - 0.1*(1 + 0.9) = -0.29, w = 1.51.
  auto opt = Sgd({{"learning_rate", 0.1}, {"momentum", 0.5}, {"wd", 0.5}});
  std::vector<float> w{2.f};
  ExpectNear(Step(*opt, w, {1.f}), {1.8});
  ExpectNear(Step(*opt, w, {1.f}), {1.51});
}

TEST(SgdTest, RescaleGrad) {
  auto opt = Sgd({{"learning_rate", 1.0}, {"rescale_grad", 0.25}});
  std::vector<float> w{0.f, 1.f};
  ExpectNear(Step(*opt, w, {4.f, -8.f}), {-1.0, 3.0});
}

TEST(SgdTest, ClippingAppliesToTheRescaledGradient) {
  // rescale 2 then clip to [-1, 1]: 0.25 -> 0.5; 0.75 -> 1.5 -> 1; -3 -> -6 -> -1.
  auto opt = Sgd({{"learning_rate", 1.0}, {"rescale_grad", 2.0}, {"clip_gradient", 1.0}});
  std::vector<float> w{0.f, 0.f, 0.f};
  ExpectNear(Step(*opt, w, {0.25f, 0.75f, -3.f}), {-0.5, -1.0, 1.0});
}

TEST(SgdTest, ClippingLeavesWeightDecayAlone) {
  // g is clipped to 0.1 but wd*w = 10 is not: w = 10 - 0.1*(0.1 + 10).
  for (double momentum : {0.0, 0.9}) {
    for (double nesterov : {0.0, 1.0}) {
      auto opt = Sgd({{"learning_rate", 0.1},
                      {"wd", 1.0},
                      {"clip_gradient", 0.1},
                      {"momentum", momentum},
                      {"nesterov", nesterov}});
      std::vector<float> w{10.f};
      // First step: the momentum is zero, so all three formulas give w - lr*(g + wd*w) for
      // momentum and plain; Nesterov adds momentum*(-step) on top.
      const double step = 0.1 * (0.1 + 10.0);
      const double want = 10.0 - step - (nesterov == 1.0 ? momentum * step : 0.0);
      ExpectNear(Step(*opt, w, {5.f}), {want});
    }
  }
}

TEST(SgdTest, ClipGradientZeroOrNegativeIsOff) {
  for (double clip : {0.0, -1.0, -5.0}) {
    auto opt = Sgd({{"learning_rate", 1.0}, {"clip_gradient", clip}});
    std::vector<float> w{0.f};
    ExpectNear(Step(*opt, w, {100.f}), {-100.0});
  }
}

TEST(SgdTest, NesterovWithoutMomentumIsPlainSgd) {
  auto nag = Sgd({{"learning_rate", 0.1}, {"nesterov", 1}, {"wd", 0.1}});
  auto plain = Sgd({{"learning_rate", 0.1}, {"wd", 0.1}});
  std::vector<float> a{1.f, 2.f}, b{1.f, 2.f};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Step(*nag, a, {0.3f, -1.f}), Step(*plain, b, {0.3f, -1.f}));
}

// ---- Many steps against a double-precision reference of the textbook formulas ----

struct Options {
  double lr, momentum, wd, rescale, clip;
  bool nesterov;
};

// The formulas as the brief and MXNet's Python optimizer state them.
void ReferenceStep(const Options& o, std::vector<double>& w, std::vector<double>& mom,
                   const std::vector<float>& grad) {
  for (size_t i = 0; i < w.size(); ++i) {
    double g = o.rescale * grad[i];
    if (o.clip > 0) g = std::min(o.clip, std::max(-o.clip, g));
    if (o.momentum == 0) {
      w[i] -= o.lr * (g + o.wd * w[i]);
    } else if (o.nesterov) {
      const double gw = g + o.wd * w[i];
      mom[i] = o.momentum * mom[i] + gw;
      w[i] -= o.lr * (gw + o.momentum * mom[i]);
    } else {
      mom[i] = o.momentum * mom[i] - o.lr * (g + o.wd * w[i]);
      w[i] += mom[i];
    }
  }
}

TEST(SgdTest, ManyStepsMatchTheReferenceForEveryOptionCombination) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::vector<Options> cases = {
      {0.05, 0, 0, 1, -1, false},
      {0.05, 0.9, 0, 1, -1, false},
      {0.05, 0.9, 0, 1, -1, true},
      {0.02, 0.8, 0.01, 0.5, -1, false},
      {0.02, 0.8, 0.01, 0.5, 0.7, true},
      {0.1, 0, 0.001, 2, 0.5, false},
      {0.03, 0.5, 0.0001, 1.0 / 32, 0.02, false},
  };
  for (const Options& o : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "lr " << o.lr << " momentum " << o.momentum << " wd " << o.wd << " rescale "
                 << o.rescale << " clip " << o.clip << " nesterov " << o.nesterov);
    auto opt = Sgd({{"learning_rate", o.lr},
                    {"momentum", o.momentum},
                    {"wd", o.wd},
                    {"rescale_grad", o.rescale},
                    {"clip_gradient", o.clip},
                    {"nesterov", o.nesterov ? 1 : 0}});
    const size_t n = 37;  // not a multiple of any vector width: the loops' tails run too
    std::vector<float> w(n);
    for (float& x : w) x = normal(rng);
    std::vector<double> ref_w(w.begin(), w.end()), ref_mom(n, 0.0);
    for (int step = 0; step < 20; ++step) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(rng);
      opt->Update(5, w, g);
      ReferenceStep(o, ref_w, ref_mom, g);
    }
    ExpectNear(w, ref_w, 1e-4);
  }
}

// ---- Learning rate changes ----

TEST(SgdTest, SetLearningRateAppliesFromTheNextUpdate) {
  auto opt = Sgd({{"learning_rate", 0.1}, {"momentum", 0.9}});
  std::vector<float> w{1.f};
  ExpectNear(Step(*opt, w, {1.f}), {0.9});  // mom = -0.1
  opt->set_learning_rate(0.2);
  EXPECT_NEAR(opt->learning_rate(), 0.2, 1e-7);
  // As MXNet's sgd_mom_update: the momentum keeps the velocity taken at the old rate.
  ExpectNear(Step(*opt, w, {1.f}), {0.61});  // mom = 0.9*(-0.1) - 0.2 = -0.29
  // The spec stays the one the optimizer was built from.
  EXPECT_EQ(opt->spec().params.at("learning_rate"), 0.1);
}

// A store's change between two steps: every index's update of that step takes the new rate,
// whether it ran before the change was made (index 2, behind) or after (index 1, ahead).
TEST(SgdTest, SetLearningRateFromAnUpdateNumberReachesEveryIndexAtThatUpdate) {
  auto opt = Sgd({{"learning_rate", 0.1}});
  std::vector<float> ahead{0.f}, behind{0.f};
  Step(*opt, ahead, {1.f}, 1);  // update 1 of index 1: -0.1
  opt->set_learning_rate_from(2, 0.5);
  EXPECT_EQ(opt->learning_rate(), 0.5);
  Step(*opt, behind, {1.f}, 2);  // update 1 of index 2: still 0.1
  Step(*opt, ahead, {1.f}, 1);   // update 2 of index 1: 0.5
  Step(*opt, behind, {1.f}, 2);  // update 2 of index 2: 0.5
  ExpectNear(ahead, {-0.6});
  ExpectNear(behind, {-0.6});
  // A later change from an earlier update replaces it; set_learning_rate drops every change.
  opt->set_learning_rate_from(5, 0.25);
  opt->set_learning_rate_from(4, 1.0);
  EXPECT_EQ(opt->LearningRateAt(3), 0.5);
  EXPECT_EQ(opt->LearningRateAt(5), 1.0);
  opt->set_learning_rate(0.2);
  EXPECT_EQ(opt->LearningRateAt(1), 0.2);
  EXPECT_EQ(opt->LearningRateAt(9), 0.2);
  EXPECT_THROW(opt->set_learning_rate_from(0, 0.1), InvalidArgument);
  EXPECT_THROW(opt->set_learning_rate_from(3, -1), InvalidArgument);
  EXPECT_THROW(opt->set_learning_rate_from((uint64_t{1} << 53) + 1, 0.1), InvalidArgument);
}

// Saved state keeps the changes (version 2), so a restored server continues them; without
// changes the state is version 1, as before.
TEST(SgdTest, RateChangesSurviveSaveAndLoad) {
  auto opt = Sgd({{"learning_rate", 0.1}, {"momentum", 0.9}});
  std::vector<float> w{1.f};
  Step(*opt, w, {1.f}, 7);
  EXPECT_EQ(opt->SaveState()[4], 1);  // the version's first byte
  opt->set_learning_rate_from(3, 0.05);
  const std::string saved = opt->SaveState();
  EXPECT_EQ(saved[4], 2);
  auto restored = Sgd({{"learning_rate", 0.1}, {"momentum", 0.9}});
  restored->LoadState(saved);
  EXPECT_EQ(restored->SaveState(), saved);
  EXPECT_EQ(restored->LearningRateAt(2), 0.1);
  EXPECT_EQ(restored->LearningRateAt(3), 0.05);
  std::vector<float> a = w, b = w;
  Step(*opt, a, {1.f}, 7);
  Step(*restored, b, {1.f}, 7);
  EXPECT_EQ(a, b);
}

TEST(SgdTest, SetLearningRateRefusesBadRates) {
  auto opt = Sgd({{"learning_rate", 0.1}});
  EXPECT_THROW(opt->set_learning_rate(-0.1), InvalidArgument);
  EXPECT_THROW(opt->set_learning_rate(std::numeric_limits<double>::quiet_NaN()), InvalidArgument);
  EXPECT_THROW(opt->set_learning_rate(std::numeric_limits<double>::infinity()), InvalidArgument);
  EXPECT_NEAR(opt->learning_rate(), 0.1, 1e-7);
  opt->set_learning_rate(0);  // a schedule may end at zero
  EXPECT_EQ(opt->learning_rate(), 0);
}

// ---- State per index ----

TEST(SgdTest, PlainSgdCountsUpdatesWithoutKeepingBuffers) {
  // Momentum 0 keeps no momentum, but each index still counts its updates for the schedule.
  auto opt = Sgd({{"learning_rate", 0.1}});
  std::vector<float> w{1.f};
  for (int i = 0; i < 3; ++i) opt->Update(4, w, std::vector<float>{1.f});
  EXPECT_EQ(opt->UpdateCount(4), 3u);
}

TEST(SgdTest, StateIsKeptPerIndex) {
  const std::map<std::string, double> params{{"learning_rate", 0.1}, {"momentum", 0.9}};
  auto shared = Sgd(params);
  auto only_a = Sgd(params);
  auto only_b = Sgd(params);
  std::vector<float> a{1.f, 2.f}, b{-1.f, 0.5f, 3.f}, a2 = a, b2 = b;
  for (int step = 0; step < 5; ++step) {
    const std::vector<float> ga{0.1f * step, -1.f}, gb{2.f, 0.f, -0.5f * step};
    shared->Update(1, a, ga);
    shared->Update(2, b, gb);
    only_a->Update(1, a2, ga);
    only_b->Update(2, b2, gb);
  }
  EXPECT_EQ(a, a2);
  EXPECT_EQ(b, b2);
}

TEST(SgdTest, MismatchedLengthsAreRefused) {
  auto opt = Sgd({{"learning_rate", 0.1}, {"momentum", 0.9}});
  std::vector<float> w(4, 1.f), g3(3, 1.f), g4(4, 1.f);
  EXPECT_THROW(opt->Update(0, w, g3), InvalidArgument);
  opt->Update(0, w, g4);
  std::vector<float> w5(5, 1.f), g5(5, 1.f);
  try {
    opt->Update(0, w5, g5);  // index 0 has 4 elements of state
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("index 0"), std::string::npos) << e.what();
  }
}

// ---- Threads ----

TEST(SgdTest, ConcurrentUpdatesOfDifferentIndexesAreCorrect) {
  const std::map<std::string, double> params{
      {"learning_rate", 0.01}, {"momentum", 0.9}, {"nesterov", 1}, {"wd", 1e-4}};
  constexpr int kThreads = 8;
  constexpr int kSteps = 200;
  constexpr size_t kSize = 1000;
  auto gradient = [](int t, int step, size_t i) {
    return std::sin(0.001f * static_cast<float>(i) + static_cast<float>(t * 31 + step));
  };
  auto run = [&](Optimizer& opt, int t, std::vector<float>& w) {
    std::vector<float> g(kSize);
    for (int step = 0; step < kSteps; ++step) {
      for (size_t i = 0; i < kSize; ++i) g[i] = gradient(t, step, i);
      opt.Update(static_cast<uint64_t>(t), w, g);
    }
  };
  auto concurrent = Sgd(params);
  std::vector<std::vector<float>> weights(kThreads, std::vector<float>(kSize, 1.f));
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] { run(*concurrent, t, weights[t]); });
    }
  }
  for (int t = 0; t < kThreads; ++t) {
    auto alone = Sgd(params);
    std::vector<float> w(kSize, 1.f);
    run(*alone, t, w);
    EXPECT_EQ(weights[t], w) << "thread " << t;
  }
}

// ---- Element-wise: parts updated separately equal the whole (servers own parts of a key) ----

TEST(SgdTest, UpdatingPartsSeparatelyEqualsUpdatingTheWhole) {
  const std::map<std::string, double> params{{"learning_rate", 0.05}, {"momentum", 0.9},
                                             {"nesterov", 1},         {"wd", 0.01},
                                             {"rescale_grad", 0.5},   {"clip_gradient", 0.8}};
  for (double nesterov : {0.0, 1.0}) {
    auto p = params;
    p["nesterov"] = nesterov;
    auto whole = Sgd(p);
    auto parts = Sgd(p);
    constexpr size_t kSize = 1001;
    const size_t cuts[] = {0, 3, 400, 777, kSize};  // odd sizes and offsets
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> w_whole(kSize);
    for (float& x : w_whole) x = normal(rng);
    std::vector<float> w_parts = w_whole;
    for (int step = 0; step < 10; ++step) {
      std::vector<float> g(kSize);
      for (float& x : g) x = 2.f * normal(rng);
      whole->Update(42, w_whole, g);
      for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
        const size_t len = cuts[k + 1] - cuts[k];
        parts->Update(1000 + k, std::span<float>(w_parts).subspan(cuts[k], len),
                      std::span<const float>(g).subspan(cuts[k], len));
      }
    }
    EXPECT_EQ(w_whole, w_parts) << "nesterov " << nesterov;
  }
}

}  // namespace
}  // namespace dtrain

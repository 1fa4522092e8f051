// Learning-rate schedules: exact rates at chosen update counts, agreement with MXNet's stateful
// FactorScheduler and CosineScheduler (transcribed below from mxnet/lr_scheduler.py), each index
// counting its own updates, the rate reaching the kernels, and the checks on their parameters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"

namespace dtrain {
namespace {

using optim_test::InvalidArgumentFrom;
using ::testing::HasSubstr;

std::unique_ptr<Optimizer> Make(const std::string& scheduler, std::map<std::string, double> params,
                                const std::string& name = "sgd") {
  return CreateOptimizer({name, std::move(params), scheduler});
}

// MXNet's schedulers as the Python has them: called with num_update = 1, 2, 3, ... in turn.
struct MxnetWarmup {
  double base_lr;
  uint64_t warmup_steps = 0;
  double warmup_begin_lr = 0;
  double WarmupLr(uint64_t num_update) const {
    const double increase = (base_lr - warmup_begin_lr) * static_cast<double>(num_update) /
                            static_cast<double>(warmup_steps);
    return warmup_begin_lr + increase;
  }
};

struct MxnetFactorScheduler : MxnetWarmup {
  uint64_t step;
  double factor, stop_factor_lr;
  uint64_t count = 0;
  double operator()(uint64_t num_update) {
    if (num_update < warmup_steps) return WarmupLr(num_update);
    while (num_update > count + step) {
      count += step;
      base_lr *= factor;
      if (base_lr < stop_factor_lr) base_lr = stop_factor_lr;
    }
    return base_lr;
  }
};

struct MxnetCosineScheduler : MxnetWarmup {
  uint64_t max_update;
  double final_lr;
  double base_lr_orig = base_lr;
  double operator()(uint64_t num_update) {
    if (num_update < warmup_steps) return WarmupLr(num_update);
    if (num_update <= max_update) {
      base_lr = final_lr + (base_lr_orig - final_lr) *
                               (1 + std::cos(std::numbers::pi *
                                             static_cast<double>(num_update - warmup_steps) /
                                             static_cast<double>(max_update - warmup_steps))) /
                               2;
    }
    return base_lr;
  }
};

// ---- Exact rates ----

TEST(LrScheduleTest, NoScheduleIsTheBaseRate) {
  auto opt = Make("", {{"learning_rate", 0.3}});
  for (uint64_t t : {1ull, 2ull, 1000ull, 1ull << 40}) EXPECT_EQ(opt->LearningRateAt(t), 0.3);
}

TEST(LrScheduleTest, StepDropsAfterEachStepAndStopsAtTheFloor) {
  // MXNet's FactorScheduler: the rate drops when the count passes step, 2*step, ... (at t = 4, 7,
  // 10, ...), and never below stop_factor_lr.
  auto opt =
      Make("step",
           {{"learning_rate", 1}, {"lr_step", 3}, {"lr_factor", 0.5}, {"lr_stop_factor_lr", 0.1}});
  const std::map<uint64_t, double> want = {{1, 1},    {3, 1},     {4, 0.5},      {6, 0.5},
                                           {7, 0.25}, {9, 0.25},  {10, 0.125},   {12, 0.125},
                                           {13, 0.1}, {100, 0.1}, {1000000, 0.1}};
  for (const auto& [t, rate] : want) EXPECT_EQ(opt->LearningRateAt(t), rate) << "t " << t;
}

TEST(LrScheduleTest, StepMatchesMxnetsFactorScheduler) {
  auto opt = Make("step", {{"learning_rate", 0.1}, {"lr_step", 5}, {"lr_factor", 0.9}});
  MxnetFactorScheduler mxnet{{0.1}, 5, 0.9, 1e-8};
  for (uint64_t t = 1; t <= 400; ++t) EXPECT_DOUBLE_EQ(opt->LearningRateAt(t), mxnet(t)) << t;
}

TEST(LrScheduleTest, StepWithWarmupMatchesMxnet) {
  auto opt = Make("step", {{"learning_rate", 0.1},
                           {"lr_step", 4},
                           {"lr_factor", 0.5},
                           {"stop_factor_lr", 0.02},
                           {"lr_warmup_steps", 6},
                           {"lr_warmup_begin", 0.01}});
  MxnetFactorScheduler mxnet{{0.1, 6, 0.01}, 4, 0.5, 0.02};
  for (uint64_t t = 1; t <= 40; ++t) EXPECT_EQ(opt->LearningRateAt(t), mxnet(t)) << t;
  EXPECT_EQ(opt->LearningRateAt(1), 0.01 + (0.1 - 0.01) * 1 / 6);
  EXPECT_EQ(opt->LearningRateAt(8), 0.05);   // k = 1: the count is not offset by the warm-up
  EXPECT_EQ(opt->LearningRateAt(13), 0.02);  // 0.0125 is below the floor
}

TEST(LrScheduleTest, CosineWithoutWarmup) {
  auto opt = Make("cosine", {{"learning_rate", 2}, {"lr_max_update", 4}});
  EXPECT_EQ(opt->LearningRateAt(1), 2 * (1 + std::cos(std::numbers::pi / 4)) / 2);
  EXPECT_DOUBLE_EQ(opt->LearningRateAt(1), 1 + std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(opt->LearningRateAt(2), 1.0);
  EXPECT_DOUBLE_EQ(opt->LearningRateAt(3), 1 - std::sqrt(0.5));
  EXPECT_EQ(opt->LearningRateAt(4), 0.0);  // lr_final
  EXPECT_EQ(opt->LearningRateAt(5), 0.0);
  EXPECT_EQ(opt->LearningRateAt(1000), 0.0);
}

TEST(LrScheduleTest, CosineWithWarmup) {
  // Warm-up from 0.2 to 1 over 4 updates, then cosine from 1 down to 0.1 at update 12.
  auto opt = Make("cosine", {{"learning_rate", 1},
                             {"lr_max_update", 12},
                             {"lr_final", 0.1},
                             {"lr_warmup_steps", 4},
                             {"lr_warmup_begin", 0.2}});
  EXPECT_DOUBLE_EQ(opt->LearningRateAt(1), 0.4);
  EXPECT_DOUBLE_EQ(opt->LearningRateAt(2), 0.6);
  EXPECT_DOUBLE_EQ(opt->LearningRateAt(3), 0.8);
  EXPECT_DOUBLE_EQ(opt->LearningRateAt(4), 1.0);   // cos(0)
  EXPECT_DOUBLE_EQ(opt->LearningRateAt(8), 0.55);  // half way: (1 + cos(pi/2)) / 2
  EXPECT_EQ(opt->LearningRateAt(12), 0.1);
  EXPECT_EQ(opt->LearningRateAt(13), 0.1);
}

TEST(LrScheduleTest, CosineMatchesMxnetsCosineScheduler) {
  for (uint64_t warmup : {0, 10}) {
    auto opt = Make("cosine", {{"learning_rate", 0.05},
                               {"lr_max_update", 100},
                               {"lr_final", 0.001},
                               {"lr_warmup_steps", static_cast<double>(warmup)},
                               {"lr_warmup_begin", 0.005}});
    MxnetCosineScheduler mxnet{{0.05, warmup, 0.005}, 100, 0.001};
    for (uint64_t t = 1; t <= 150; ++t) {
      EXPECT_EQ(opt->LearningRateAt(t), mxnet(t)) << "t " << t << " warmup " << warmup;
    }
  }
}

TEST(LrScheduleTest, SetLearningRateChangesTheBaseOfTheSchedule) {
  auto opt = Make("step", {{"learning_rate", 1}, {"lr_step", 2}, {"lr_factor", 0.5}});
  opt->set_learning_rate(4);
  EXPECT_EQ(opt->learning_rate(), 4);
  EXPECT_EQ(opt->LearningRateAt(1), 4);
  EXPECT_EQ(opt->LearningRateAt(3), 2);
  EXPECT_EQ(opt->spec().params.at("learning_rate"), 1);
}

// ---- The rate reaches the kernels, per index ----

TEST(LrScheduleTest, EachIndexCountsItsOwnUpdates) {
  // Plain SGD, g = 1: each update subtracts the rate of that index's update number.
  auto opt = Make("step", {{"learning_rate", 1}, {"lr_step", 2}, {"lr_factor", 0.5}});
  std::vector<float> a{0.f}, b{0.f};
  for (int i = 0; i < 4; ++i) opt->Update(1, a, std::vector<float>{1.f});
  EXPECT_EQ(a[0], -3.f);  // 1 + 1 + 0.5 + 0.5
  opt->Update(2, b, std::vector<float>{1.f});
  EXPECT_EQ(b[0], -1.f);  // index 2's first update: the full rate
  EXPECT_EQ(opt->UpdateCount(1), 4u);
  EXPECT_EQ(opt->UpdateCount(2), 1u);
}

TEST(LrScheduleTest, EveryOptimizerTakesTheScheduledRate) {
  // The same steps with the rate the schedule gives, or with that rate set by hand before each
  // update, are bit-identical.
  for (const char* name : {"sgd", "nag", "adam", "adagrad", "rmsprop"}) {
    SCOPED_TRACE(name);
    std::map<std::string, double> params{{"learning_rate", 0.1}, {"lr_max_update", 5}};
    if (std::string(name) != "adam" && std::string(name) != "adagrad") params["momentum"] = 0.9;
    if (std::string(name) == "rmsprop") params.erase("momentum"), params["centered"] = 1;
    auto scheduled = Make("cosine", params, name);
    params.erase("lr_max_update");
    auto by_hand = Make("", params, name);
    std::vector<float> a{1.f, -0.5f}, b = a;
    for (uint64_t t = 1; t <= 7; ++t) {
      const std::vector<float> g{0.3f * static_cast<float>(t), -0.2f};
      scheduled->Update(0, a, g);
      by_hand->set_learning_rate(scheduled->LearningRateAt(t));
      by_hand->Update(0, b, g);
      ASSERT_EQ(a, b) << "t " << t;
    }
    EXPECT_EQ(scheduled->LearningRateAt(6), 0.0);
  }
}

// ---- Checks ----

TEST(LrScheduleTest, BadSchedulesAreRefused) {
  const struct {
    const char* scheduler;
    std::map<std::string, double> params;
    const char* message;
  } cases[] = {
      {"linear", {}, "unknown lr_scheduler \"linear\""},
      {"Step", {{"lr_step", 2}}, "unknown lr_scheduler \"Step\""},
      {"step", {}, "needs lr_step"},
      {"cosine", {}, "needs lr_max_update"},
      {"step", {{"lr_step", 0}}, "lr_step = 0"},
      {"step", {{"lr_step", 2.5}}, "whole number"},
      {"step", {{"lr_step", 1e300}}, "whole number"},
      {"step", {{"lr_step", 2}, {"lr_factor", 1.5}}, "lr_factor = 1.5"},
      {"step", {{"lr_step", 2}, {"lr_factor", -0.5}}, "lr_factor = -0.5"},
      {"step", {{"lr_step", 2}, {"lr_stop_factor_lr", -1}}, "lr_stop_factor_lr = -1"},
      {"step", {{"lr_step", 2}, {"lr_stop_factor_lr", 1}, {"stop_factor_lr", 1}}, "two names"},
      {"step",
       {{"lr_step", 2}, {"lr_max_update", 5}},
       "lr_max_update belongs to lr_scheduler \"cosine\""},
      {"cosine",
       {{"lr_max_update", 5}, {"lr_factor", 0.5}},
       "lr_factor belongs to lr_scheduler \"step\""},
      {"",
       {{"lr_step", 2}},
       "lr_step belongs to lr_scheduler \"step\", but the spec has no lr_scheduler"},
      {"", {{"lr_warmup_steps", 2}}, "lr_warmup_steps belongs to an lr_scheduler"},
      {"cosine", {{"lr_max_update", 5}, {"lr_warmup_steps", 5}}, "must be below lr_max_update"},
      {"cosine", {{"lr_max_update", 5}, {"lr_warmup_begin", 0.5}}, "lr_warmup_begin = 0.5"},
      {"cosine", {{"lr_max_update", 5}, {"lr_final", -0.1}}, "lr_final = -0.1"},
      {"cosine", {{"lr_max_update", 5}, {"lr_warmup_steps", -1}}, "lr_warmup_steps = -1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    auto params = c.params;
    params["learning_rate"] = 0.1;
    EXPECT_THAT(InvalidArgumentFrom([&] { Make(c.scheduler, params); }), HasSubstr(c.message));
  }
}

TEST(LrScheduleTest, ScheduleTravelsInTheSpec) {
  const OptimizerSpec spec{
      "adam", {{"learning_rate", 0.01}, {"lr_max_update", 50}, {"lr_final", 0.001}}, "cosine"};
  auto here = CreateOptimizer(spec);
  auto there = CreateOptimizer(OptimizerSpec::FromJson(spec.ToJson()));
  for (uint64_t t : {1, 10, 25, 50, 51})
    EXPECT_EQ(here->LearningRateAt(t), there->LearningRateAt(t));
}

}  // namespace
}  // namespace dtrain

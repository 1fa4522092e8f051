// What must hold for every optimizer and variant, because servers and workers both run them: state
// is kept per index, parts of an array updated separately equal the whole (bit for bit), updates of
// different indexes may run on threads at once, and a refused update changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"

namespace dtrain {
namespace {

using optim_test::NamedSpec;
using optim_test::RandomVector;
using optim_test::SameBits;

class EveryOptimizerTest : public ::testing::TestWithParam<NamedSpec> {};

TEST_P(EveryOptimizerTest, StateIsKeptPerIndex) {
  const OptimizerSpec& spec = GetParam().spec;
  auto shared = CreateOptimizer(spec);
  auto only_a = CreateOptimizer(spec);
  auto only_b = CreateOptimizer(spec);
  std::mt19937 rng(3);
  std::vector<float> a = RandomVector(rng, 5), b = RandomVector(rng, 9), a2 = a, b2 = b;
  for (int step = 0; step < 8; ++step) {
    const std::vector<float> ga = RandomVector(rng, a.size()), gb = RandomVector(rng, b.size());
    shared->Update(1, a, ga);
    if (step % 2 == 0) shared->Update(2, b, gb);  // b is updated half as often: its own count
    only_a->Update(1, a2, ga);
    if (step % 2 == 0) only_b->Update(2, b2, gb);
  }
  EXPECT_TRUE(SameBits(a, a2));
  EXPECT_TRUE(SameBits(b, b2));
  EXPECT_EQ(shared->UpdateCount(1), 8u);
  EXPECT_EQ(shared->UpdateCount(2), 4u);
  EXPECT_EQ(shared->UpdateCount(3), 0u);
}

// A server holds slot `part` of key `key` at index (key << 20) | part; a worker holds the key.
TEST_P(EveryOptimizerTest, UpdatingPartsSeparatelyEqualsUpdatingTheWholeBitForBit) {
  const OptimizerSpec& spec = GetParam().spec;
  auto worker = CreateOptimizer(spec);
  auto servers = CreateOptimizer(spec);
  constexpr uint64_t kKey = 42;
  constexpr size_t kSize = 1001;
  const size_t cuts[] = {0, 3, 400, 777, kSize};  // odd sizes and offsets: vector loops and tails
  std::mt19937 rng(11);
  std::vector<float> whole = RandomVector(rng, kSize), parts = whole;
  for (int step = 0; step < 12; ++step) {
    const std::vector<float> g = RandomVector(rng, kSize, 2.f);
    worker->Update(kKey, whole, g);
    for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
      const size_t len = cuts[k + 1] - cuts[k];
      servers->Update((kKey << 20) | k, std::span<float>(parts).subspan(cuts[k], len),
                      std::span<const float>(g).subspan(cuts[k], len));
    }
    ASSERT_TRUE(SameBits(whole, parts)) << "step " << step;
  }
}

// A server splits a big slot's update over its reduction threads (SetParallelFor): pieces of odd
// sizes and offsets, run on threads, must give the single-threaded update bit for bit.
TEST_P(EveryOptimizerTest, AnUpdateSplitOverThreadsEqualsOneThreadsBitForBit) {
  const OptimizerSpec& spec = GetParam().spec;
  auto one_thread = CreateOptimizer(spec);
  auto split = CreateOptimizer(spec);
  int64_t pieces_run = 0;
  split->SetParallelFor([&](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t cuts[] = {0, std::min<int64_t>(n, 5), n / 2 + 1, std::max<int64_t>(n - 3, 0), n};
    std::vector<std::thread> threads;
    for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
      if (cuts[k] < cuts[k + 1]) threads.emplace_back(fn, cuts[k], cuts[k + 1]);
    }
    for (auto& t : threads) t.join();
    pieces_run += static_cast<int64_t>(threads.size());
  });
  std::mt19937 rng(5);
  std::vector<float> a = RandomVector(rng, 1003), b = a;
  for (int step = 0; step < 10; ++step) {
    const std::vector<float> g = RandomVector(rng, a.size(), 2.f);
    one_thread->Update(7, a, g);
    split->Update(7, b, g);
  }
  EXPECT_TRUE(SameBits(a, b));
  EXPECT_EQ(split->UpdateCount(7), 10u);  // one update per call, however it was split
  EXPECT_EQ(pieces_run, 10 * 4);
  EXPECT_EQ(one_thread->SaveState(), split->SaveState());
}

TEST_P(EveryOptimizerTest, ConcurrentUpdatesOfDifferentIndexesAreCorrect) {
  const OptimizerSpec& spec = GetParam().spec;
  constexpr int kThreads = 8;
  constexpr int kSteps = 100;
  constexpr size_t kSize = 1000;
  auto run = [&](Optimizer& opt, int t, std::vector<float>& w) {
    std::mt19937 rng(100 + t);
    for (int step = 0; step < kSteps; ++step) {
      opt.Update(static_cast<uint64_t>(t) << 20, w, RandomVector(rng, kSize));
    }
  };
  auto concurrent = CreateOptimizer(spec);
  std::vector<std::vector<float>> weights(kThreads, std::vector<float>(kSize, 0.5f));
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] { run(*concurrent, t, weights[t]); });
    }
  }
  for (int t = 0; t < kThreads; ++t) {
    auto alone = CreateOptimizer(spec);
    std::vector<float> w(kSize, 0.5f);
    run(*alone, t, w);
    EXPECT_TRUE(SameBits(weights[t], w)) << "thread " << t;
    EXPECT_EQ(concurrent->UpdateCount(static_cast<uint64_t>(t) << 20), uint64_t{kSteps});
  }
}

TEST_P(EveryOptimizerTest, RefusedUpdatesChangeNothing) {
  const OptimizerSpec& spec = GetParam().spec;
  auto opt = CreateOptimizer(spec);
  auto reference = CreateOptimizer(spec);
  std::vector<float> w(4, 1.f), w_ref = w, g3(3, 1.f), g4(4, 0.5f);
  EXPECT_THROW(opt->Update(0, w, g3), InvalidArgument);  // lengths differ
  EXPECT_EQ(opt->UpdateCount(0), 0u);
  opt->Update(0, w, g4);
  reference->Update(0, w_ref, g4);
  std::vector<float> w5(5, 1.f), g5(5, 1.f);
  const std::vector<float> w5_before = w5;
  try {
    opt->Update(0, w5, g5);  // index 0 has state for 4 elements
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("index 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(w5, w5_before);
  EXPECT_EQ(opt->UpdateCount(0), 1u);
  opt->Update(0, w, g4);
  reference->Update(0, w_ref, g4);
  EXPECT_TRUE(SameBits(w, w_ref));
}

TEST_P(EveryOptimizerTest, UpdateOnDeviceRefusesHostValuesAndChangesNothing) {
  auto opt = CreateOptimizer(GetParam().spec);
  const Array w = Array::FromFloats(std::vector<float>{1.f, 2.f});
  const Array g = Array::FromFloats(std::vector<float>{0.5f, 0.5f});
  const std::string message =
      optim_test::InvalidArgumentFrom([&] { opt->UpdateOnDevice(4, w, g); });
  EXPECT_NE(message.find("index 4: UpdateOnDevice takes values on a device"), std::string::npos)
      << message;
  EXPECT_EQ(w.ToVector(), (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(opt->UpdateCount(4), 0u);
}

TEST_P(EveryOptimizerTest, EmptyArraysAreUpdated) {
  auto opt = CreateOptimizer(GetParam().spec);
  std::vector<float> empty;
  opt->Update(7, empty, empty);
  EXPECT_EQ(opt->UpdateCount(7), 1u);
}

TEST_P(EveryOptimizerTest, ZeroLearningRateLeavesWeightsAlone) {
  // Without the schedule: a warm-up starts elsewhere, and the step schedule's floor is above 0.
  // None of the variants clips these weights.
  OptimizerSpec spec = GetParam().spec;
  spec.lr_scheduler.clear();
  std::erase_if(spec.params,
                [](const auto& p) { return p.first.find("lr_") != std::string::npos; });
  auto opt = CreateOptimizer(spec);
  opt->set_learning_rate(0);
  std::mt19937 rng(5);
  std::vector<float> w = RandomVector(rng, 33, 0.3f);
  const std::vector<float> before = w;
  for (int i = 0; i < 3; ++i) opt->Update(0, w, RandomVector(rng, 33));
  EXPECT_EQ(w, before);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EveryOptimizerTest,
                         ::testing::ValuesIn(optim_test::EveryVariant()),
                         [](const auto& info) { return info.param.label; });

}  // namespace
}  // namespace dtrain

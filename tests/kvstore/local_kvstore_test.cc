// The "local" and "device" KVStore: sums over devices, assignment without optimizer, updates with
// one, the list forms, and the errors a user can cause.
#include "kvstore/local_kvstore.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "common/elementwise.h"
#include "dtrain/common/error.h"
#include "kv_test_support.h"

namespace dtrain {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using kvtest::Floats;
using kvtest::InvalidArgumentFrom;
using kvtest::PullVector;

TEST(LocalKVStoreTest, Identity) {
  LocalKVStore local("local");
  EXPECT_EQ(local.type(), "local");
  EXPECT_EQ(local.rank(), 0);
  EXPECT_EQ(local.num_workers(), 1);
  local.Barrier();
  local.WaitAll();
  EXPECT_EQ(LocalKVStore("device").type(), "device");
  EXPECT_THAT(InvalidArgumentFrom([] { LocalKVStore("dist_sync"); }), HasSubstr("dist_sync"));
}

TEST(LocalKVStoreTest, InitCopiesTheValue) {
  LocalKVStore kv("local");
  Array w = Floats({1, 2, 3});
  kv.Init(3, w);
  w.Fill(9);  // the store kept its own copy
  EXPECT_THAT(PullVector(kv, 3, {3}), ElementsAre(1, 2, 3));
}

TEST(LocalKVStoreTest, PushSumsTheDevicesAndPullReturnsTheSum) {
  for (const char* type : {"local", "device"}) {
    LocalKVStore kv(type);
    kv.Init(3, Array({2, 2}));
    Operation push = kv.Push(3, {Floats({1, 2, 3, 4}, {2, 2}), Floats({10, 20, 30, 40}, {2, 2}),
                                 Floats({100, 200, 300, 400}, {2, 2})});
    EXPECT_TRUE(push.done());  // local operations are complete at once
    push.Wait();
    EXPECT_THAT(PullVector(kv, 3, {2, 2}), ElementsAre(111, 222, 333, 444)) << type;
  }
}

TEST(LocalKVStoreTest, WithoutOptimizerEachPushReplacesTheValue) {
  // MXNet's default local updater assigns the merged value; it does not accumulate.
  LocalKVStore kv("local");
  kv.Init(1, Floats({5, 5}));
  kv.Push(1, {Floats({1, 1}), Floats({2, 2})});
  kv.Push(1, {Floats({0.5, 0.5})});
  EXPECT_THAT(PullVector(kv, 1, {2}), ElementsAre(0.5, 0.5));
}

TEST(LocalKVStoreTest, PullFillsEveryOut) {
  LocalKVStore kv("local");
  kv.Init(1, Floats({1, 2}));
  Array a({2}), b({2});
  kv.Pull(1, {a, b}).Wait();
  EXPECT_THAT(a.ToVector(), ElementsAre(1, 2));
  EXPECT_THAT(b.ToVector(), ElementsAre(1, 2));
}

TEST(LocalKVStoreTest, ShapesMayDifferWhenTheElementCountMatches) {
  LocalKVStore kv("local");
  kv.Init(1, Array({2, 3}));
  kv.Push(1, {Floats({1, 2, 3, 4, 5, 6})});  // flat (6,)
  EXPECT_THAT(PullVector(kv, 1, {3, 2}), ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(LocalKVStoreTest, SgdUpdatesTheWeightWithTheSummedGradient) {
  LocalKVStore kv("local");
  kv.Init(0, Floats({1, 2}));
  kv.SetOptimizer({"sgd", {{"learning_rate", 0.1}}});
  kv.Push(0, {Floats({0.5, 0.5}), Floats({0.5, 1.5})});  // sum (1, 2)
  const auto w = PullVector(kv, 0, {2});
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  EXPECT_FLOAT_EQ(w[1], 1.8f);
}

TEST(LocalKVStoreTest, UpdatesMatchTheOptimizerAppliedDirectly) {
  const OptimizerSpec spec{
      "sgd", {{"learning_rate", 0.05}, {"momentum", 0.9}, {"wd", 0.01}, {"nesterov", 1}}};
  LocalKVStore kv("device");
  kv.SetOptimizer(spec);
  kv.Init(7, Floats({1, -1, 0.5}));
  kv.Init(8, Floats({2, 2, 2}));  // another key: its own momentum
  auto direct = CreateOptimizer(spec);
  std::vector<float> w{1, -1, 0.5};
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> g0{0.1f * step, 1, -2}, g1{0.3f, -0.2f, 0.5f * step};
    kv.Push(7, {Floats(g0), Floats(g1)});
    kv.Push(8, {Floats({1, 1, 1})});
    std::vector<float> sum{g0[0] + g1[0], g0[1] + g1[1], g0[2] + g1[2]};
    direct->Update(7, w, sum);
  }
  EXPECT_EQ(PullVector(kv, 7, {3}), w);
}

TEST(LocalKVStoreTest, SetOptimizerStartsFreshAndKeepsTheOldOneOnABadSpec) {
  LocalKVStore kv("local");
  kv.Init(0, Floats({1}));
  kv.SetOptimizer({"sgd", {{"learning_rate", 1.0}}});
  EXPECT_THAT(InvalidArgumentFrom([&] {
                kv.SetOptimizer({"sgd", {{"momentum", 2}}});
              }),
              HasSubstr("momentum"));
  kv.Push(0, {Floats({0.25})});
  EXPECT_THAT(PullVector(kv, 0, {1}), ElementsAre(0.75));
}

TEST(LocalKVStoreTest, PushPullReturnsTheResultOfThePush) {
  LocalKVStore kv("local");
  kv.Init(4, Floats({1, 1}));
  Array out({2});
  kv.PushPull(4, {Floats({1, 2}), Floats({3, 4})}, {out}).Wait();
  EXPECT_THAT(out.ToVector(), ElementsAre(4, 6));

  kv.SetOptimizer({"sgd", {{"learning_rate", 0.5}}});
  // In place, as Gluon's trainer does: the gradients are overwritten with the new weights.
  Array g0 = Floats({1, 1}), g1 = Floats({1, 3});
  kv.PushPull(4, {g0, g1}, {g0, g1}).Wait();
  EXPECT_THAT(g0.ToVector(), ElementsAre(3, 4));  // (4, 6) - 0.5 * (2, 4)
  EXPECT_THAT(g1.ToVector(), ElementsAre(3, 4));
}

TEST(LocalKVStoreTest, ListForms) {
  LocalKVStore kv("local");
  const std::vector<Key> keys{5, 9};
  const std::vector<Array> init{Floats({0, 0}), Floats({0, 0, 0})};
  kv.Init(keys, init);

  const std::vector<std::vector<Array>> values{{Floats({1, 2}), Floats({1, 2})},
                                               {Floats({1, 1, 1})}};
  kv.Push(keys, values).Wait();
  Array o5({2}), o9({3});
  const std::vector<std::vector<Array>> outs{{o5}, {o9}};
  Operation pulled = kv.Pull(keys, outs);
  EXPECT_TRUE(pulled.done());
  pulled.Wait();
  EXPECT_THAT(o5.ToVector(), ElementsAre(2, 4));
  EXPECT_THAT(o9.ToVector(), ElementsAre(1, 1, 1));

  const std::vector<std::vector<Array>> more{{Floats({3, 3})}, {Floats({4, 4, 4})}};
  kv.PushPull(keys, more, outs).Wait();
  EXPECT_THAT(o5.ToVector(), ElementsAre(3, 3));
  EXPECT_THAT(o9.ToVector(), ElementsAre(4, 4, 4));
}

TEST(LocalKVStoreTest, ListFormsGroupARepeatedKeyIntoOnePush) {
  // As MXNet does: keys (5, 5) push the sum of both entries, not the second alone.
  LocalKVStore kv("local");
  kv.Init(5, Floats({0, 0}));
  const std::vector<Key> keys{5, 5};
  const std::vector<std::vector<Array>> values{{Floats({1, 2})}, {Floats({10, 20})}};
  kv.Push(keys, values).Wait();
  EXPECT_THAT(PullVector(kv, 5, {2}), ElementsAre(11, 22));
  Array a({2}), b({2});
  const std::vector<std::vector<Array>> outs{{a}, {b}};
  kv.PushPull(keys, values, outs).Wait();
  EXPECT_THAT(a.ToVector(), ElementsAre(11, 22));
  EXPECT_THAT(b.ToVector(), ElementsAre(11, 22));
}

TEST(LocalKVStoreTest, ListFormsRefuseMismatchedCounts) {
  LocalKVStore kv("local");
  const std::vector<Key> keys{1, 2};
  const std::vector<Array> one_value{Floats({1})};
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Init(keys, one_value); }),
              HasSubstr("2 keys but 1 values"));
  kv.Init(1, Floats({0}));
  kv.Init(2, Floats({0}));
  const std::vector<std::vector<Array>> one_list{{Floats({1})}};
  const std::vector<std::vector<Array>> two_lists{{Floats({1})}, {Floats({1})}};
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Push(keys, one_list); }), HasSubstr("2 keys but 1"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Pull(keys, one_list); }), HasSubstr("2 keys but 1"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPull(keys, two_lists, one_list); }),
              HasSubstr("2 keys but 1 out lists"));
  EXPECT_THAT(PullVector(kv, 1, {1}), ElementsAre(0));  // nothing was pushed
}

// ---- Errors: each names the key and leaves the store as it was ----

TEST(LocalKVStoreTest, UnknownKey) {
  LocalKVStore kv("local");
  const std::string want = "key 7 was never initialised (call Init first)";
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Push(7, {Floats({1})}); }), HasSubstr(want));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Pull(7, {Array({1})}); }), HasSubstr(want));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPull(7, {Floats({1})}, {Array({1})}); }),
              HasSubstr(want));
}

TEST(LocalKVStoreTest, InitTwice) {
  LocalKVStore kv("local");
  kv.Init(3, Floats({1}));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Init(3, Floats({2})); }),
              HasSubstr("key 3 is already initialised"));
  EXPECT_THAT(PullVector(kv, 3, {1}), ElementsAre(1));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Init(4, Array()); }), HasSubstr("key 4"));
}

TEST(LocalKVStoreTest, WrongLengthNamesKeyAndShapes) {
  LocalKVStore kv("local");
  kv.Init(3, Array({2, 2}));
  const std::string push = InvalidArgumentFrom([&] { kv.Push(3, {Array({2, 2}), Array({5})}); });
  EXPECT_THAT(push, HasSubstr("key 3"));
  EXPECT_THAT(push, HasSubstr("value 1 has shape (5,) float32"));
  EXPECT_THAT(push, HasSubstr("the key holds (2,2) float32"));
  const std::string pull = InvalidArgumentFrom([&] { kv.Pull(3, {Array({3})}); });
  EXPECT_THAT(pull, HasSubstr("key 3"));
  EXPECT_THAT(pull, HasSubstr("out 0 has shape (3,) float32"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPull(3, {Array({4})}, {Array({1})}); }),
              HasSubstr("key 3"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Push(3, {Array({4}, DType::kFloat64)}); }),
              HasSubstr("(4,) float64"));
  EXPECT_THAT(PullVector(kv, 3, {4}), ElementsAre(0, 0, 0, 0));
}

TEST(LocalKVStoreTest, EmptyOrUndefinedArrays) {
  LocalKVStore kv("local");
  kv.Init(2, Floats({1}));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Push(2, {}); }), HasSubstr("key 2: no values given"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Pull(2, {}); }), HasSubstr("key 2: no outs given"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPull(2, {Floats({1})}, {}); }),
              HasSubstr("key 2: no outs given"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Push(2, {Array()}); }),
              HasSubstr("key 2: value 0 is an undefined Array"));
  EXPECT_THAT(PullVector(kv, 2, {1}), ElementsAre(1));
}

TEST(LocalKVStoreTest, HalfPrecisionSumsAndOptimiserTypesAreCheckedUpFront) {
  LocalKVStore kv("local");
  kv.Init(1, Array({2}, DType::kFloat16));
  // float16 sums go through float32 and round once: 1.5 + 2.25 = 3.75 exactly.
  Array a({2}, DType::kFloat16), b({2}, DType::kFloat16);
  for (int i = 0; i < 2; ++i) {
    static_cast<uint16_t*>(a.data())[i] = FloatToHalf(1.5f);
    static_cast<uint16_t*>(b.data())[i] = FloatToHalf(2.25f);
  }
  kv.Push(1, {a, b});
  Array out({2}, DType::kFloat16);
  kv.Pull(1, {out}).Wait();
  EXPECT_EQ(HalfToFloat(static_cast<uint16_t*>(out.data())[1]), 3.75f);
  kv.Init(2, Array({2}, DType::kFloat64));
  kv.Push(2, {Array({2}, DType::kFloat64), Array({2}, DType::kFloat64)});  // float64 sums fine
  kv.SetOptimizer({"sgd", {}});
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.Push(2, {Array({2}, DType::kFloat64)}); }),
              HasSubstr("key 2: the optimizer updates float32 values only"));
}

TEST(LocalKVStoreTest, GradientCompressionQuantizesEachDeviceWithItsOwnResidual) {
  Config config;
  config.bigarray_bound = 100;  // the big key below is summed on several threads
  config.reduction_threads = 3;
  LocalKVStore kv("device", config);
  kv.SetGradientCompression({{"type", "2bit"}, {"threshold", "0.5"}});
  for (Key key : {Key{1}, Key{2}}) {
    const int64_t n = key == 1 ? 5 : 1003;
    kv.Init(key, Array({n}));
    Array a({n}), b({n});
    a.Fill(0.4f);
    b.Fill(0.3f);
    // Each device keeps what it could not send: nothing crosses in the first step; in the
    // second, device 0 has 0.8 and sends 0.5, device 1 has 0.6 and sends 0.5.
    kv.Push(key, {a, b});
    EXPECT_THAT(PullVector(kv, key, {n}), Each(0.0f));
    kv.Push(key, {a, b});
    EXPECT_THAT(PullVector(kv, key, {n}), Each(1.0f));
  }
  kv.Init(3, Array({4}));
  kv.Push(3, {Floats({0.1f, 0.2f, 0.3f, 0.4f})});  // one device: nothing crosses, nothing lost
  EXPECT_THAT(PullVector(kv, 3, {4}), ElementsAre(0.1f, 0.2f, 0.3f, 0.4f));
  EXPECT_THAT(InvalidArgumentFrom([&] {
                kv.SetGradientCompression({{"type", "1bit"}});
              }),
              HasSubstr("before the first push"));
}

// ---- Big arrays and threads ----

TEST(LocalKVStoreTest, BigArraysAreSummedOnSeveralThreads) {
  Config config;
  config.bigarray_bound = 1000;
  config.reduction_threads = 4;
  LocalKVStore kv("local", config);
  const int64_t n = 100003;  // not a multiple of the threads or of a cache line
  kv.Init(0, Array({n}));
  std::vector<Array> values;
  for (int d = 0; d < 3; ++d) {
    Array v({n});
    auto f = v.floats();
    for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(i % 1000) + d;
    values.push_back(v);
  }
  kv.Push(0, values);
  const auto sum = PullVector(kv, 0, {n});
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(sum[i], 3.f * static_cast<float>(i % 1000) + 3.f) << "element " << i;
  }
}

TEST(LocalKVStoreTest, ConcurrentPushesOfDifferentKeysWithAnOptimizer) {
  LocalKVStore kv("local");
  kv.SetOptimizer({"sgd", {{"learning_rate", 0.5}, {"momentum", 0.5}}});
  constexpr int kThreads = 6;
  constexpr int kSteps = 100;
  for (int t = 0; t < kThreads; ++t) kv.Init(t, Array({256}));
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&kv, t] {
        Array g({256});
        g.Fill(static_cast<float>(t));
        for (int s = 0; s < kSteps; ++s) kv.Push(t, {g, g});
      });
    }
  }
  // Each key alone: w starts at 0, gradient 2t every step.
  auto direct = CreateOptimizer({"sgd", {{"learning_rate", 0.5}, {"momentum", 0.5}}});
  for (int t = 0; t < kThreads; ++t) {
    std::vector<float> w(256, 0.f), g(256, 2.f * t);
    for (int s = 0; s < kSteps; ++s) direct->Update(t, w, g);
    EXPECT_EQ(PullVector(kv, t, {256}), w) << "key " << t;
  }
}

TEST(LocalKVStoreTest, APullNeverSeesHalfAPush) {
  LocalKVStore kv("local");
  constexpr int64_t kSize = 1 << 16;
  kv.Init(0, Array({kSize}));
  std::atomic<bool> stop{false};
  std::vector<std::jthread> pushers;
  for (int t = 1; t <= 2; ++t) {
    pushers.emplace_back([&, t] {
      Array v({kSize});
      v.Fill(static_cast<float>(t));
      while (!stop) kv.Push(0, {v});
    });
  }
  Array out({kSize});
  for (int i = 0; i < 200; ++i) {
    kv.Pull(0, {out}).Wait();
    const auto f = out.floats();
    for (int64_t j = 1; j < kSize; ++j) ASSERT_EQ(f[j], f[0]) << "pull " << i << " element " << j;
  }
  stop = true;
}

}  // namespace
}  // namespace dtrain

// Whole dist KVStore jobs in one process (scheduler, servers and workers as threads over the
// in-memory transport): what the protocol promises when nothing fails. The same scenarios run as
// real processes in tests/integration/ps_job_test.cc.
//
// Values are small integers, so float sums are exact and pulls are compared bit for bit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/common/array.h"
#include "optim/optimizer.h"
#include "inprocess_job.h"

namespace dtrain::testing {
namespace {

// Keys around the big-array bound (1000 elements here) and the chunk size (1024 bytes = 256
// floats): some go whole to one server in one slot, some whole but cut into several slots, some
// split over every server and cut again.
const std::vector<int64_t> kSizes = {1, 7, 255, 256, 257, 999, 1000, 1001, 2048, 10007};

Config SmallSlots(int servers, int workers) {
  Config c = InMemoryJobConfig(servers, workers);
  c.bigarray_bound = 1000;
  c.chunk_bytes = 1024;
  return c;
}

float PushedValue(int rank, int round, Key key, int64_t i) {
  return static_cast<float>((rank + 1) * (round + 1) + static_cast<int>((i + key) % 7));
}

float ExpectedSum(int workers, int round, Key key, int64_t i) {
  return static_cast<float>((round + 1) * workers * (workers + 1) / 2 +
                            workers * static_cast<int>((i + key) % 7));
}

Array Filled(int64_t size, const std::function<float(int64_t)>& value) {
  Array a({size});
  auto v = a.floats();
  for (int64_t i = 0; i < size; ++i) v[i] = value(i);
  return a;
}

// `value` split over `devices` arrays whose sum is exactly `value`.
std::vector<Array> DeviceValues(const Array& value, int devices) {
  std::vector<Array> out;
  for (int d = 0; d < devices; ++d) out.push_back(Array(value.shape()));
  auto v = value.floats();
  for (int64_t i = 0; i < value.size(); ++i) {
    float rest = v[i];
    for (int d = 0; d + 1 < devices; ++d) {
      out[d].floats()[i] = static_cast<float>(d + 1);
      rest -= static_cast<float>(d + 1);
    }
    out[devices - 1].floats()[i] = rest;
  }
  return out;
}

// "" if `got` holds want(i) at every i, else where it first differs.
std::string Mismatch(const Array& got, const std::function<float(int64_t)>& want) {
  auto g = got.floats();
  for (int64_t i = 0; i < got.size(); ++i) {
    if (g[i] != want(i)) {
      return "element " + std::to_string(i) + " of " + std::to_string(got.size()) + ": got " +
             std::to_string(g[i]) + ", want " + std::to_string(want(i));
    }
  }
  return "";
}

struct Layout {
  int workers;
  int servers;
};

std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  return std::to_string(info.param.workers) + "workers" + std::to_string(info.param.servers) +
         "servers";
}

class DistSyncJobTest : public ::testing::TestWithParam<Layout> {};

TEST_P(DistSyncJobTest, EveryPullIsExactlyTheSumOfThatRoundsPushes) {
  const int n = GetParam().workers;
  InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
  job.Run([&](DistKVStore& kv) {
    ASSERT_EQ(kv.num_workers(), n);
    std::vector<Key> keys;
    std::vector<Array> init;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      keys.push_back(static_cast<Key>(k));
      // Only rank 0's initial values are kept; the others offer different ones.
      init.push_back(Filled(kSizes[k], [&](int64_t i) {
        return static_cast<float>(kv.rank() * 1000 + static_cast<int>(i % 5) + k);
      }));
    }
    kv.Init(keys, init);
    for (size_t k = 0; k < keys.size(); ++k) {
      Array out({kSizes[k]});
      kv.Pull(keys[k], {out}).Wait();
      ASSERT_EQ(Mismatch(out, [&](int64_t i) { return static_cast<float>(i % 5 + k); }), "")
          << "initial value of key " << k << " on rank " << kv.rank();
    }
    const int rounds = 8;
    for (int round = 0; round < rounds; ++round) {
      // Rounds alternate push + pull and pushpull; the number of devices changes too.
      const int devices = 1 + round % 3;
      std::vector<std::vector<Array>> outs(keys.size());
      std::vector<Operation> ops;
      for (size_t k = 0; k < keys.size(); ++k) {
        Array value =
            Filled(kSizes[k], [&](int64_t i) { return PushedValue(kv.rank(), round, keys[k], i); });
        outs[k] = {Array({kSizes[k]}), Array({kSizes[k]})};  // pulled to two devices
        if (round % 2 == 0) {
          ops.push_back(kv.PushPull(keys[k], DeviceValues(value, devices), outs[k]));
        } else {
          kv.Push(keys[k], DeviceValues(value, devices));
          ops.push_back(kv.Pull(keys[k], outs[k]));
        }
      }
      Operation::Combine(ops).Wait();
      for (size_t k = 0; k < keys.size(); ++k) {
        for (size_t d = 0; d < outs[k].size(); ++d) {
          ASSERT_EQ(
              Mismatch(outs[k][d], [&](int64_t i) { return ExpectedSum(n, round, keys[k], i); }),
              "")
              << "round " << round << " key " << keys[k] << " device " << d << " rank "
              << kv.rank();
        }
      }
    }
  });
  job.ExpectSuccess();
  for (int i = 0; i < n; ++i) EXPECT_EQ(job.worker(i).rank, i) << "DTRAIN_NODE_RANK is kept";
}

TEST_P(DistSyncJobTest, ListFormsCoverEveryKeyInOneOperation) {
  const int n = GetParam().workers;
  InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
  job.Run([&](DistKVStore& kv) {
    std::vector<Key> keys = {10, 11, 12};
    std::vector<int64_t> sizes = {3, 1000, 5000};
    std::vector<Array> init;
    for (int64_t s : sizes) init.push_back(Array({s}));
    kv.Init(keys, init);
    for (int round = 0; round < 3; ++round) {
      std::vector<std::vector<Array>> values, outs;
      for (size_t k = 0; k < keys.size(); ++k) {
        values.push_back({Filled(
            sizes[k], [&](int64_t i) { return PushedValue(kv.rank(), round, keys[k], i); })});
        outs.push_back({Array({sizes[k]})});
      }
      kv.PushPull(keys, values, outs).Wait();
      for (size_t k = 0; k < keys.size(); ++k) {
        ASSERT_EQ(
            Mismatch(outs[k][0], [&](int64_t i) { return ExpectedSum(n, round, keys[k], i); }), "")
            << "round " << round << " key " << keys[k];
      }
    }
  });
  job.ExpectSuccess();
}

// A worker that pushes again before the round is complete has the later pushes held for the
// next rounds; each of its operations gets the value of its own round.
TEST_P(DistSyncJobTest, PushesAheadOfTheRoundAreHeldForTheirOwnRound) {
  const int n = GetParam().workers;
  InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
  job.Run([&](DistKVStore& kv) {
    const Key key = 4;
    const int64_t size = 3000;  // split over every server, several slots each
    kv.Init(key, Array({size}));
    // The last rank lags, so that the others' later pushes reach the servers while their first
    // round is still open.
    auto lag = [&] {
      if (kv.rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    };
    auto value = [&](int round) {
      return Filled(size, [&](int64_t i) { return PushedValue(kv.rank(), round, key, i); });
    };
    auto want = [&](int round) {
      return [&, round](int64_t i) { return ExpectedSum(n, round, key, i); };
    };

    // Five rounds of pushpull, none waited for before the next is issued.
    lag();
    std::vector<Array> outs;
    std::vector<Operation> ops;
    for (int round = 0; round < 5; ++round) {
      outs.push_back(Array({size}));
      ops.push_back(kv.PushPull(key, {value(round)}, {outs.back()}));
    }
    for (auto& op : ops) op.Wait();
    for (int round = 0; round < 5; ++round) {
      ASSERT_EQ(Mismatch(outs[round], want(round)), "") << "pushpull of round " << round;
    }

    // push, push, pull: the pull follows the second push, so it gets the second round's sum.
    lag();
    Array out({size});
    kv.Push(key, {value(5)});
    kv.Push(key, {value(6)});
    kv.Pull(key, {out}).Wait();
    ASSERT_EQ(Mismatch(out, want(6)), "") << "pull after two pushes";
  });
  job.ExpectSuccess();
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistSyncJobTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 2}, Layout{4, 2}, Layout{3, 1}),
                         LayoutName);

class DistAsyncJobTest : public ::testing::TestWithParam<Layout> {};

TEST_P(DistAsyncJobTest, FinalValueIsTheTotalOfAllPushes) {
  const int n = GetParam().workers;
  InProcessJob job("dist_async", SmallSlots(GetParam().servers, n));
  const std::vector<int64_t> sizes = {1, 300, 1000, 5000};
  const int rounds = 10;
  job.Run([&](DistKVStore& kv) {
    for (size_t k = 0; k < sizes.size(); ++k) kv.Init(static_cast<Key>(k), Array({sizes[k]}));
    for (int round = 0; round < rounds; ++round) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        Array value({sizes[k]});
        value.Fill(static_cast<float>(kv.rank() + 1 + round));
        kv.Push(static_cast<Key>(k), DeviceValues(value, 1 + round % 3));
      }
    }
    kv.WaitAll();
    kv.Barrier();  // every worker's pushes are in
    // Sum over workers r and rounds t of (r + 1 + t).
    const float want = static_cast<float>(rounds * n * (n + 1) / 2 + n * rounds * (rounds - 1) / 2);
    for (size_t k = 0; k < sizes.size(); ++k) {
      Array out({sizes[k]});
      kv.Pull(static_cast<Key>(k), {out}).Wait();
      ASSERT_EQ(Mismatch(out, [&](int64_t) { return want; }), "") << "key " << k;
    }
  });
  job.ExpectSuccess();
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistAsyncJobTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 2}, Layout{3, 1}), LayoutName);

TEST(DistJobRanks, RanksAreDistinctAndCoverTheJob) {
  const int n = 4;
  InProcessJob job("dist_sync", SmallSlots(2, n));
  job.set_fixed_ranks(false);  // the scheduler assigns ranks in order of arrival
  job.Run([&](DistKVStore& kv) {
    EXPECT_EQ(kv.num_workers(), n);
    // Each worker sets its own element of a one-hot vector: the sum is all ones iff ranks differ.
    kv.Init(0, Array({n}));
    Array mine({n});
    mine.floats()[kv.rank()] = 1.0f;
    Array out({n});
    kv.PushPull(0, {mine}, {out}).Wait();
    EXPECT_EQ(Mismatch(out, [](int64_t) { return 1.0f; }), "");
  });
  job.ExpectSuccess();
  std::set<int> ranks;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(job.worker(i).num_workers, n);
    ranks.insert(job.worker(i).rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
}

TEST(DistJobBarrier, HoldsEveryoneUntilTheLastArrives) {
  const int n = 3;
  const int rounds = 3;
  InProcessJob job("dist_sync", SmallSlots(1, n));
  std::vector<std::atomic<int>> arrived(rounds);
  job.Run([&](DistKVStore& kv) {
    for (int round = 0; round < rounds; ++round) {
      if (kv.rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
      arrived[round].fetch_add(1);
      const auto start = Clock::now();
      kv.Barrier();
      EXPECT_EQ(arrived[round].load(), n)
          << "rank " << kv.rank() << " passed barrier " << round << " early";
      if (kv.rank() == 0) {
        EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(100))
            << "rank 0 did not wait for the late rank";
      }
    }
  });
  job.ExpectSuccess();
}

struct OptimizerCase {
  std::string name;
  int workers;
  int servers;
  int64_t size;
};

class UpdateOnKVStoreTest : public ::testing::TestWithParam<OptimizerCase> {};

// update_on_kvstore: the servers apply the optimizer to each round's merged gradient; the weights
// pulled equal those of the same optimizer run locally on the summed gradients, to the bit.
TEST_P(UpdateOnKVStoreTest, PulledWeightsEqualALocalOptimizerOnTheSummedGradients) {
  const OptimizerCase c = GetParam();
  InProcessJob job("dist_sync", SmallSlots(c.servers, c.workers));
  const OptimizerSpec spec{"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}}};
  const Key key = 7;
  job.Run([&](DistKVStore& kv) {
    auto grad = [&](int rank, int round, int64_t i) {
      return static_cast<float>((rank + 1) * (round + 1) - static_cast<int>(i % 5));
    };
    Array weight = Filled(c.size, [](int64_t i) { return 1.0f + static_cast<float>(i % 3); });
    kv.Init(key, weight);
    kv.SetOptimizer(spec);

    auto reference = CreateOptimizer(spec);
    std::vector<float> want(weight.floats().begin(), weight.floats().end());
    for (int round = 0; round < 6; ++round) {
      Array g = Filled(c.size, [&](int64_t i) { return grad(kv.rank(), round, i); });
      Array out({c.size});
      if (round % 2 == 0) {
        kv.PushPull(key, {g}, {out}).Wait();
      } else {
        kv.Push(key, {g});
        kv.Pull(key, {out}).Wait();
      }
      std::vector<float> summed(c.size, 0.0f);
      for (int r = 0; r < c.workers; ++r) {
        for (int64_t i = 0; i < c.size; ++i) summed[i] += grad(r, round, i);
      }
      reference->Update(static_cast<uint64_t>(key), want, summed);
      ASSERT_EQ(Mismatch(out, [&](int64_t i) { return want[i]; }), "") << "round " << round;
    }
  });
  job.ExpectSuccess();
}

INSTANTIATE_TEST_SUITE_P(Cases, UpdateOnKVStoreTest,
                         ::testing::Values(OptimizerCase{"SmallKeyTwoWorkers", 2, 1, 100},
                                           OptimizerCase{"BigKeySplitOverTwoServers", 2, 2, 3001}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dtrain::testing

// The engine over real Gloo backends, N ranks as threads of this process (rendezvous through a
// FileStore, pairs over loopback TCP): the protocol without process start-up costs. Whole jobs of
// real processes are in jobs_test.cc.
#include "collectives/engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "../integration/subprocess.h"
#include "collectives/adasum.h"
#include "collectives/engine/negotiation.h"
#include "common/usable_cores.h"
#include "dtrain/common/error.h"
#include "support/thread_cpu_time.h"

namespace dtrain::collectives {
namespace {

using dtrain::testing::TempDir;

CollectivesConfig RankConfig(int rank, int size, const std::string& dir) {
  CollectivesConfig c;
  c.backend = BackendKind::kGloo;
  c.rank = rank;
  c.size = size;
  c.file_store_dir = dir;
  c.node_host = "127.0.0.1";
  c.connect_timeout = Duration(20000);
  c.collective_timeout = Duration(20000);
  return c;
}

// Runs body(engine, rank) on `size` ranks, each a thread with its own backend and engine.
void RunRanks(int size, const std::function<void(Engine&, int)>& body,
              const std::function<void(CollectivesConfig&)>& tune = {}) {
  TempDir dir;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        CollectivesConfig config = RankConfig(r, size, dir.path());
        if (tune) tune(config);
        Engine engine(std::shared_ptr<Communicator>(CreateGlooBackend(config)), config);
        body(engine, r);
        engine.Shutdown();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// "prefix" + i (built by appending: GCC 12 warns falsely about "literal" + std::to_string).
std::string Numbered(std::string prefix, int64_t i) {
  prefix += std::to_string(i);
  return prefix;
}

Array Filled(int64_t n, float value) {
  Array a({n});
  a.Fill(value);
  return a;
}

TEST(Engine, RanksSubmittingInDifferentOrdersGetExactSums) {
  RunRanks(3, [](Engine& engine, int rank) {
    std::vector<Array> in, out;
    std::vector<Handle> handles;
    const std::vector<int64_t> sizes = {1, 33, 4096, 100000};
    for (size_t i = 0; i < sizes.size(); ++i) {
      in.push_back(Filled(sizes[i], static_cast<float>(rank + 1)));
      out.push_back(Array({sizes[i]}));
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      const size_t i = rank == 1 ? sizes.size() - 1 - k : k;
      handles.push_back(engine.Allreduce(Numbered("t", i), in[i], out[i],
                                         i % 2 ? ReduceOp::kAverage : ReduceOp::kSum));
    }
    for (auto& h : handles) h.Wait();
    for (size_t i = 0; i < sizes.size(); ++i) {
      const float want = i % 2 ? 2.0f : 6.0f;
      for (float v : out[i].floats()) ASSERT_EQ(v, want) << "t" << i;
      for (float v : in[i].floats()) ASSERT_EQ(v, rank + 1.0f) << "input of t" << i;
    }
  });
}

TEST(Engine, SmallAllreducesReadyTogetherShareOneBackendCall) {
  RunRanks(
      2,
      [](Engine& engine, int rank) {
        std::vector<Array> arrays;
        for (int i = 0; i < 50; ++i) arrays.push_back(Filled(100, static_cast<float>(i)));
        engine.Barrier().Wait();
        const auto before = engine.stats();
        std::vector<Handle> handles;
        for (int i = 0; i < 50; ++i) {
          handles.push_back(
              engine.Allreduce(Numbered("g", i), arrays[i], arrays[i], ReduceOp::kSum));
        }
        for (auto& h : handles) h.Wait();
        const auto after = engine.stats();
        for (int i = 0; i < 50; ++i) ASSERT_EQ(arrays[i].floats()[0], 2.0f * i);
        // A 50 ms cycle gathers all 50 on both ranks before they are announced.
        EXPECT_LE(after.data_calls - before.data_calls, 3u);
        EXPECT_GE(after.fused_tensors - before.fused_tensors, 40u);
      },
      [](CollectivesConfig& c) { c.cycle_time = std::chrono::milliseconds(50); });
}

TEST(Engine, AllreducesSubmittedWhileRoundsAreHeldRunInOneBackendCall) {
  // Horovod's grouped allreduce. Without the hold, the engine starts a round at the first
  // submission, and the pause lets it run that one alone before the rest arrive.
  RunRanks(2, [](Engine& engine, int rank) {
    std::vector<Array> arrays;
    for (int i = 0; i < 6; ++i) arrays.push_back(Filled(1000 * (i + 1), static_cast<float>(i)));
    engine.Barrier().Wait();
    const auto before = engine.stats();
    std::vector<Handle> handles;
    engine.HoldRounds();
    for (int i = 0; i < 6; ++i) {
      handles.push_back(engine.Allreduce(Numbered("g", i), arrays[i], arrays[i], ReduceOp::kSum));
      if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    engine.ReleaseRounds();
    for (auto& h : handles) h.Wait();
    const auto after = engine.stats();
    for (int i = 0; i < 6; ++i) ASSERT_EQ(arrays[i].floats()[0], 2.0f * i);
    EXPECT_EQ(after.data_calls - before.data_calls, 1u);
    EXPECT_EQ(after.fused_tensors - before.fused_tensors, 6u);
  });
}

TEST(Engine, ALateRanksSubmissionRunsAtOnceThoughItsRoundOpenedEmpty) {
  // After the warm-up both engines sleep a cycle (4 s). Rank 0 submits `z` at 3.5 s and waits in
  // a round; rank 1's round opens at 4 s on its own, empty, and rank 1 submits `z` at 4.5 s.
  // Rank 0, which has submitted everything pending, waits inside the rounds, so `z` runs as soon
  // as rank 1 submits it. A rank 0 that slept a cycle after the empty round (from 3.5 s, when its
  // round started) kept rank 1 waiting until 7.5 s.
  constexpr auto kCycle = std::chrono::milliseconds(4000);
  RunRanks(
      2,
      [&](Engine& engine, int rank) {
        Array warm = Filled(4, 1.0f), z = Filled(4, 1.0f);
        engine.Allreduce("warm", warm, warm, ReduceOp::kSum).Wait();
        std::this_thread::sleep_for(rank == 0 ? kCycle * 7 / 8 : kCycle * 9 / 8);
        const auto submitted = std::chrono::steady_clock::now();
        engine.Allreduce("z", z, z, ReduceOp::kSum).Wait();
        const auto waited = std::chrono::steady_clock::now() - submitted;
        EXPECT_EQ(z.floats()[0], 2.0f);
        if (rank == 1) EXPECT_LT(waited, kCycle * 3 / 8);
      },
      [&](CollectivesConfig& c) { c.cycle_time = kCycle; });
}

TEST(Engine, AWaitingCallerPollsForTheSpinTimeWhereTheHostHasACorePerRankThenSleeps) {
  // Rank 1 submits 300 ms after rank 0, whose caller waits meanwhile: polling (yielding) for the
  // spin time where its 2 ranks have 2 cores, its thread's CPU time grows by about that much, and
  // sleeping afterwards, by next to nothing. Either way the result comes when rank 1 submits.
  const bool core_per_rank = UsableCores() >= 2;
  for (const auto spin : {std::chrono::microseconds(40000), std::chrono::microseconds(0)}) {
    std::chrono::microseconds cpu{};
    Duration waited{};
    RunRanks(
        2,
        [&](Engine& engine, int rank) {
          Array warm = Filled(4, 1.0f), late = Filled(4, 1.0f);
          engine.Allreduce("warm", warm, warm, ReduceOp::kSum).Wait();
          if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
          Handle h = engine.Allreduce("late", late, late, ReduceOp::kSum);
          // By now the engine thread runs the round that waits for rank 1, so the caller cannot
          // run it itself (Engine::Impl::HelpWithRound): it polls.
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          const auto start = Clock::now();
          const auto cpu_before = test_support::ThreadCpuTime();
          h.Wait();
          if (rank == 0) {
            cpu = test_support::ThreadCpuTime() - cpu_before;
            waited = std::chrono::duration_cast<Duration>(Clock::now() - start);
          }
          EXPECT_EQ(late.floats()[0], 2.0f);
        },
        [&](CollectivesConfig& c) { c.spin_wait = spin; });
    EXPECT_GE(waited, Duration(200)) << "spin " << spin.count() << " us";
    if (spin.count() > 0 && core_per_rank) {
      EXPECT_GE(cpu, std::chrono::microseconds(2000)) << "it did not poll";
      EXPECT_LE(cpu, std::chrono::microseconds(150000)) << "it polled past the spin time";
    } else {
      EXPECT_LE(cpu, std::chrono::microseconds(1500)) << "it polled, spin " << spin.count();
    }
  }
}

TEST(Engine, AWaitingCallerRunsTheRoundItsSubmissionMadeDueWhereItPolls) {
  // Both ranks submit and wait at once, 100 times: a polling caller takes the round its
  // submission made due whenever the engine thread has not woken up for it yet (no hand-over of
  // the round to a thread that must first get a core); a sleeping one never does.
  if (UsableCores() < 2) GTEST_SKIP() << "needs a core for each of the 2 ranks to poll";
  for (const auto spin : {std::chrono::microseconds(1000), std::chrono::microseconds(0)}) {
    RunRanks(
        2,
        [&](Engine& engine, int) {
          Array a = Filled(1000, 1.0f);
          for (int i = 0; i < 100; ++i) {
            engine.Allreduce("a", a, a, ReduceOp::kAverage).Wait();
            ASSERT_EQ(a.floats()[999], 1.0f);
          }
          const uint64_t by_callers = engine.stats().caller_rounds;
          if (spin.count() > 0) {
            EXPECT_GT(by_callers, 0u);
          } else {
            EXPECT_EQ(by_callers, 0u);
          }
          EXPECT_LE(by_callers, engine.stats().rounds);
        },
        [&](CollectivesConfig& c) { c.spin_wait = spin; });
  }
}

TEST(Engine, AFusionThresholdOfZeroSendsEveryTensorAlone) {
  RunRanks(
      2,
      [](Engine& engine, int) {
        std::vector<Array> arrays;
        std::vector<Handle> handles;
        for (int i = 0; i < 10; ++i) arrays.push_back(Filled(10, 1.0f));
        const auto before = engine.stats();
        for (int i = 0; i < 10; ++i) {
          handles.push_back(
              engine.Allreduce(Numbered("u", i), arrays[i], arrays[i], ReduceOp::kSum));
        }
        for (auto& h : handles) h.Wait();
        EXPECT_EQ(engine.stats().data_calls - before.data_calls, 10u);
        EXPECT_EQ(engine.stats().fused_tensors, 0u);
      },
      [](CollectivesConfig& c) {
        c.fusion_threshold_bytes = 0;
        c.cycle_time = std::chrono::milliseconds(20);
      });
}

TEST(Engine, AllreducesReadyTogetherRunHighestPriorityFirst) {
  RunRanks(
      2,
      [](Engine& engine, int) {
        // Every rank submits the six from the engine's own thread (the gate's completion), so
        // they are announced in one round and become ready together.
        std::mutex mutex;
        std::condition_variable all_finished;
        std::vector<std::string> finished;
        std::vector<Array> arrays;
        for (int i = 0; i < 6; ++i) arrays.push_back(Filled(10, 1.0f));
        std::vector<Handle> handles;
        std::promise<void> submitted;
        Array gate = Filled(1, 1.0f);
        engine.Allreduce("gate", gate, gate, ReduceOp::kSum).OnDone([&](std::exception_ptr) {
          const std::vector<std::pair<std::string, int>> order = {
              {"low0", 0}, {"low1", 0}, {"mid", 5}, {"low2", 0}, {"urgent", 10}, {"low3", 0}};
          for (size_t i = 0; i < order.size(); ++i) {
            const std::string name = order[i].first;
            handles.push_back(
                engine.Allreduce(name, arrays[i], arrays[i], ReduceOp::kSum, order[i].second));
            handles.back().OnDone([&, name](std::exception_ptr) {
              std::lock_guard<std::mutex> lock(mutex);
              finished.push_back(name);
              all_finished.notify_all();
            });
          }
          submitted.set_value();
        });
        ASSERT_EQ(submitted.get_future().wait_for(std::chrono::seconds(20)),
                  std::future_status::ready);
        for (auto& h : handles) h.Wait();
        // A handle's waiters wake before its completion callback runs.
        std::unique_lock<std::mutex> lock(mutex);
        ASSERT_TRUE(all_finished.wait_for(lock, std::chrono::seconds(10),
                                          [&] { return finished.size() == 6; }));
        EXPECT_EQ(finished,
                  (std::vector<std::string>{"urgent", "mid", "low0", "low1", "low2", "low3"}));
        for (const Array& a : arrays) EXPECT_EQ(a.ToVector(), std::vector<float>(10, 2.0f));
      },
      [](CollectivesConfig& c) { c.fusion_threshold_bytes = 0; });  // one tensor a batch
}

TEST(Engine, AllgatherAndBroadcast) {
  RunRanks(3, [](Engine& engine, int rank) {
    Array mine({rank + 1, 2});
    for (int64_t i = 0; i < mine.size(); ++i) mine.floats()[i] = static_cast<float>(rank * 10 + i);
    Handle g = engine.Allgather("gather", mine);
    Array b = Filled(5, rank == 2 ? 7.0f : 0.0f);
    Handle h = engine.Broadcast("bcast", b, 2);
    g.Wait();
    h.Wait();
    const Array all = g.result();
    ASSERT_EQ(all.shape(), (Shape{6, 2}));
    const std::vector<float> want = {0, 1, 10, 11, 12, 13, 20, 21, 22, 23, 24, 25};
    EXPECT_EQ(all.ToVector(), want);
    EXPECT_EQ(b.ToVector(), std::vector<float>(5, 7.0f));

    // A rank may contribute no rows at all.
    Array some({rank, 3});
    some.Fill(static_cast<float>(rank));
    Handle z = engine.Allgather("gather.some", some);
    z.Wait();
    EXPECT_EQ(z.result().shape(), (Shape{3, 3}));
    EXPECT_EQ(z.result().ToVector(), (std::vector<float>{1, 1, 1, 2, 2, 2, 2, 2, 2}));
  });
}

TEST(Engine, AlltoallSendsEachRankItsRowsAndSaysHowManyCameFromEach) {
  RunRanks(3, [](Engine& engine, int rank) {
    // Rank s sends s + k rows to rank k, each row (s, k).
    std::vector<int64_t> splits;
    std::vector<float> values;
    for (int k = 0; k < 3; ++k) {
      splits.push_back(rank + k);
      for (int j = 0; j < rank + k; ++j) values.insert(values.end(), {float(rank), float(k)});
    }
    Array in({static_cast<int64_t>(values.size() / 2), 2});
    std::copy(values.begin(), values.end(), in.floats().begin());
    Handle h = engine.Alltoall("a2a", in, splits);
    h.Wait();
    EXPECT_EQ(h.received_rows(), (std::vector<int64_t>{rank, rank + 1, rank + 2}));
    std::vector<float> want;
    for (int s = 0; s < 3; ++s) {
      for (int j = 0; j < s + rank; ++j) want.insert(want.end(), {float(s), float(rank)});
    }
    EXPECT_EQ(h.result().shape(), (Shape{3 * rank + 3, 2}));
    EXPECT_EQ(h.result().ToVector(), want);
  });
}

TEST(Engine, ReducescatterGivesTheLowerRanksTheRowsLeftOver) {
  RunRanks(3, [](Engine& engine, int rank) {
    Array in({5, 2});
    for (int64_t i = 0; i < 10; ++i) in.floats()[i] = static_cast<float>(i * (rank + 1));
    Handle sum = engine.Reducescatter("rs", in, ReduceOp::kSum);
    Handle max = engine.Reducescatter("rs.max", in, ReduceOp::kMax);
    sum.Wait();
    max.Wait();
    // 5 rows over 3 ranks: 2, 2, 1, from rows 0, 2 and 4.
    const int64_t first = rank == 0 ? 0 : rank == 1 ? 2 : 4;
    const int64_t rows = rank == 2 ? 1 : 2;
    ASSERT_EQ(sum.result().shape(), (Shape{rows, 2}));
    for (int64_t i = 0; i < rows * 2; ++i) {
      EXPECT_EQ(sum.result().floats()[i], 6.0f * (first * 2 + i));
      EXPECT_EQ(max.result().floats()[i], 3.0f * (first * 2 + i));
    }
  });
}

TEST(Engine, AJoinedRankTakesPartInTheOthersRoundsAtOnce) {
  // Rank 0 joins (out of data) and rank 1 goes on with three allreduces, one after another. The
  // joined rank waits inside the rounds, so each runs as soon as rank 1 submits it; a joined rank
  // that slept a cycle (2 s) between rounds held each one back by up to a cycle.
  constexpr auto kCycle = std::chrono::milliseconds(2000);
  RunRanks(
      2,
      [&](Engine& engine, int rank) {
        if (rank == 0) {
          Handle join = engine.Join();
          join.Wait();
          EXPECT_EQ(join.result().floats()[0], 1.0f);  // rank 1 joined last
          return;
        }
        std::this_thread::sleep_for(kCycle / 4);  // rank 0's join has gone round
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < 3; ++i) {
          Array a = Filled(4, 2.0f);
          engine.Allreduce(Numbered("after_join", i), a, a, ReduceOp::kSum).Wait();
          EXPECT_EQ(a.floats()[0], 2.0f);  // the joined rank stands in with zeros
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, kCycle / 2);
        engine.Join().Wait();
      },
      [&](CollectivesConfig& c) { c.cycle_time = kCycle; });
}

TEST(Engine, AJoinedRankStandsInWithTheIdentityOfEachOp) {
  RunRanks(3, [](Engine& engine, int rank) {
    // The rank that joined last: rank 0 or 1, whichever joins later.
    auto join = [&engine] {
      Handle h = engine.Join();
      h.Wait();
      const int last = static_cast<int>(h.result().floats()[0]);
      EXPECT_TRUE(last == 0 || last == 1) << last;
    };
    if (rank == 2) return join();
    for (auto [op, want] : {std::pair{ReduceOp::kSum, 3.0f}, std::pair{ReduceOp::kMin, 1.0f},
                            std::pair{ReduceOp::kMax, 2.0f}, std::pair{ReduceOp::kProduct, 2.0f},
                            std::pair{ReduceOp::kAverage, 1.0f}}) {
      // Rank 0 holds 1, rank 1 holds 2, and joined rank 2 must not change the result (an average
      // counts every rank, as Horovod's does: 3 / 3).
      Array a = Filled(3, rank + 1.0f);
      engine.Allreduce(Numbered("joined.", static_cast<int>(op)), a, a, op).Wait();
      EXPECT_EQ(a.ToVector(), std::vector<float>(3, want)) << ReduceOpName(op);
    }
    join();
  });
}

TEST(Engine, MismatchedSubmissionsFailOnEveryRankAndTheEngineGoesOn) {
  RunRanks(2, [](Engine& engine, int rank) {
    Array a({3 + rank});
    try {
      engine.Allreduce("m", a, a, ReduceOp::kSum).Wait();
      ADD_FAILURE() << "no mismatch error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 allreduce(sum) float32 (4,)"), std::string::npos)
          << e.what();
    }
    Array ok = Filled(4, 1.0f);
    engine.Allreduce("m", ok, ok, ReduceOp::kSum).Wait();  // the name is free again
    EXPECT_EQ(ok.floats()[0], 2.0f);
  });
}

TEST(Engine, BadSubmissionsAreRejectedAtOnce) {
  RunRanks(1, [](Engine& engine, int) {
    Array a({4});
    Array b({5});
    EXPECT_THROW(engine.Allreduce("x", a, b, ReduceOp::kSum), InvalidArgument);
    EXPECT_THROW(engine.Allreduce("", a, a, ReduceOp::kSum), InvalidArgument);
    EXPECT_THROW(engine.Broadcast("y", a, 1), InvalidArgument);
    EXPECT_THROW(engine.Allgather("z", Array(Shape{})), InvalidArgument);
    EXPECT_THROW(engine.Alltoall("t", a, {3}), InvalidArgument);     // 3 of 4 rows
    EXPECT_THROW(engine.Alltoall("t", a, {2, 2}), InvalidArgument);  // two ranks' worth
    EXPECT_THROW(engine.Alltoall("t", a, {-1}), InvalidArgument);
    EXPECT_THROW(engine.Alltoall("t", Array(Shape{}), {1}), InvalidArgument);
    EXPECT_THROW(engine.Reducescatter("r", Array(Shape{}), ReduceOp::kSum), InvalidArgument);
    EXPECT_THROW(Handle().Wait(), InvalidArgument);
    // A job of one: every collective is its own result.
    a.Fill(3.0f);
    engine.Allreduce("one", a, a, ReduceOp::kAverage).Wait();
    EXPECT_EQ(a.floats()[0], 3.0f);
  });
}

TEST(Engine, CudaArraysAreRefusedAtOnceWhenTheJobDoesNotUseNccl) {
  RunRanks(
      1,
      [](Engine& engine, int) {
        // Never dereferenced: the engine refuses it before anything reads the memory.
        float fake[4] = {};
        const Array gpu = Array::WrapDevice(fake, {4}, DType::kFloat32, 0, nullptr, nullptr);
        try {
          engine.Allreduce("gpu", gpu, gpu, ReduceOp::kSum);
          ADD_FAILURE() << "a CUDA array was accepted without NCCL";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("through host memory"), std::string::npos)
              << e.what();
        }
        Array host({4});
        EXPECT_THROW(engine.Allreduce("mixed", host, gpu, ReduceOp::kSum), InvalidArgument);
        // The engine goes on.
        host.Fill(2.0f);
        engine.Allreduce("host", host, host, ReduceOp::kSum).Wait();
        EXPECT_EQ(host.floats()[0], 2.0f);
      },
      [](CollectivesConfig& c) { c.nccl = false; });
}

TEST(Engine, ANameMayBeInFlightOnlyOnce) {
  RunRanks(2, [](Engine& engine, int rank) {
    Array a = Filled(4, 1.0f);
    if (rank == 0) {
      Handle first = engine.Allreduce("dup", a, a, ReduceOp::kSum);
      EXPECT_THROW(engine.Allreduce("dup", a, a, ReduceOp::kSum), InvalidArgument);
      engine.Barrier().Wait();
      first.Wait();
    } else {
      engine.Barrier().Wait();
      engine.Allreduce("dup", a, a, ReduceOp::kSum).Wait();
    }
    EXPECT_EQ(a.floats()[0], 2.0f);
  });
}

TEST(Engine, WaitTimesOutNamingTheCollectiveAndTheMissingRank) {
  RunRanks(
      2,
      [](Engine& engine, int rank) {
        if (rank == 1) {
          // Never submits; the other rank gives up by its deadline.
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return;
        }
        Array a({4});
        try {
          engine.Allreduce("lonely", a, a, ReduceOp::kSum).Wait();
          ADD_FAILURE() << "no timeout";
        } catch (const TimeoutError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("'lonely'"), std::string::npos) << what;
          EXPECT_NE(what.find("rank 1 had not submitted it"), std::string::npos) << what;
        }
      },
      [](CollectivesConfig& c) { c.collective_timeout = Duration(800); });
}

TEST(Engine, RanksWaitingForEachOthersCollectivesFailAsADeadlockNamingWhoSubmittedWhat) {
  RunRanks(
      2,
      [](Engine& engine, int rank) {
        // Each rank waits for a collective the other never submits (one rank gave up on a
        // check and went on to its next collective, say).
        Array a = Filled(4, 1.0f);
        try {
          engine.Allreduce(rank == 0 ? "x" : "y", a, a, ReduceOp::kSum).Wait();
          ADD_FAILURE() << "no deadlock error";
        } catch (const InvalidArgument& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("deadlock"), std::string::npos) << what;
          EXPECT_NE(what.find("'x' submitted by rank 0, not by rank 1"), std::string::npos) << what;
          EXPECT_NE(what.find("'y' submitted by rank 1, not by rank 0"), std::string::npos) << what;
        }
        // Both names start afresh on every rank.
        for (const char* name : {"y", "x"}) {
          Array ok = Filled(4, 1.0f);
          engine.Allreduce(name, ok, ok, ReduceOp::kSum).Wait();
          EXPECT_EQ(ok.floats()[0], 2.0f) << name;
        }
      },
      [](CollectivesConfig& c) { c.deadlock_grace = Duration(300); });
}

TEST(Engine, ARankThatIsBusyRatherThanWaitingIsNoDeadlock) {
  RunRanks(
      2,
      [](Engine& engine, int rank) {
        // Rank 1 computes (no thread of it waits) for several grace times before it submits.
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        Array a = Filled(4, 1.0f);
        engine.Allreduce("late", a, a, ReduceOp::kSum).Wait();
        EXPECT_EQ(a.floats()[0], 2.0f);
      },
      [](CollectivesConfig& c) { c.deadlock_grace = Duration(100); });
}

TEST(Engine, ARankThatShutsDownFailsTheCollectivesAndJoinItNeverSubmitted) {
  // The deadline is far: the failure must come from rank 1's shutdown, not from a timeout.
  RunRanks(
      2,
      [](Engine& engine, int rank) {
        if (rank == 1) {
          engine.Barrier().Wait();  // rank 0 has submitted "orphan"
          engine.Shutdown();
          return;
        }
        Array a({4});
        Handle orphan = engine.Allreduce("orphan", a, a, ReduceOp::kSum);
        engine.Barrier().Wait();
        Handle join = engine.Join();  // before or after rank 1's shutdown: either way it fails
        for (const Handle& h : {orphan, join}) {
          try {
            h.Wait();
            ADD_FAILURE() << "completed without rank 1";
          } catch (const PeerError& e) {
            EXPECT_NE(std::string(e.what()).find("rank 1 shut down the collectives"),
                      std::string::npos)
                << e.what();
          }
        }
      },
      [](CollectivesConfig& c) { c.collective_timeout = Duration(60000); });
}

TEST(Engine, ShutdownFailsWhatNotEveryRankSubmitted) {
  RunRanks(2, [](Engine& engine, int rank) {
    Array a({4});
    Handle h;
    if (rank == 0) h = engine.Allreduce("orphan", a, a, ReduceOp::kSum);
    engine.Shutdown();
    if (rank == 0) {
      try {
        h.Wait();
        ADD_FAILURE() << "an orphan completed";
      } catch (const Error& e) {
        // Both shut down in the same round, or rank 1 first: either way rank 1 is named.
        const std::string what = e.what();
        EXPECT_TRUE(what.find("before rank 1 submitted it") != std::string::npos ||
                    what.find("rank 1 shut down the collectives") != std::string::npos)
            << what;
      }
    }
    // After shutdown, submissions fail through their handle.
    EXPECT_THROW(engine.Allreduce("late", a, a, ReduceOp::kSum).Wait(), Error);
  });
}

TEST(Engine, Fp16CompressionIsCloseAndAveragesInFloat32) {
  RunRanks(
      2,
      [](Engine& engine, int rank) {
        std::vector<Array> arrays;
        std::vector<Handle> handles;
        for (int t = 0; t < 2; ++t) {
          arrays.push_back(Array({1000}));
          for (int i = 0; i < 1000; ++i) arrays[t].floats()[i] = 0.01f * i * (rank + 1);
          handles.push_back(engine.Allreduce(Numbered("h", t), arrays[t], arrays[t],
                                             t ? ReduceOp::kAverage : ReduceOp::kSum));
        }
        for (auto& h : handles) h.Wait();
        for (int i = 0; i < 1000; ++i) {
          EXPECT_NEAR(arrays[0].floats()[i], 0.03 * i, 0.03 * i * 1e-3 + 1e-4);
          EXPECT_NEAR(arrays[1].floats()[i], 0.015 * i, 0.015 * i * 1e-3 + 1e-4);
        }
      },
      [](CollectivesConfig& c) { c.fp16_allreduce = true; });
}

// Rank r's "gradient" i: distinct on every rank, so that pairing ranks differently gives a
// different result.
float Gradient(int rank, int i) { return std::sin(1.7f * rank + 0.9f * i) + 0.1f * rank; }

TEST(Engine, AdasumCombinesAdjacentRanksFirstAndEachTensorOnItsOwn) {
  constexpr int kRanks = 4;
  constexpr int64_t kN = 33;
  // The tree Horovod's Adasum makes: adasum(adasum(g0, g1), adasum(g2, g3)).
  std::vector<std::vector<float>> g(kRanks, std::vector<float>(kN));
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < kN; ++i) g[r][i] = Gradient(r, i);
  }
  std::vector<float> low(kN), high(kN), want(kN);
  AdasumCombine(g[0].data(), g[1].data(), low.data(), {kN}, DType::kFloat32);
  AdasumCombine(g[2].data(), g[3].data(), high.data(), {kN}, DType::kFloat32);
  AdasumCombine(low.data(), high.data(), want.data(), {kN}, DType::kFloat32);
  RunRanks(kRanks, [&](Engine& engine, int rank) {
    // Submitted together, so fused: the parallel tensor must still average and the orthogonal
    // one add up, each with its own coefficients.
    Array mixed({kN}), parallel({5}), orthogonal({kRanks});
    for (int i = 0; i < kN; ++i) mixed.floats()[i] = g[rank][i];
    parallel.Fill(rank + 1.0f);
    orthogonal.Fill(0.0f);
    orthogonal.floats()[rank] = rank + 1.0f;
    std::vector<Handle> handles;
    handles.push_back(engine.Allreduce("mixed", mixed, mixed, ReduceOp::kAdasum));
    handles.push_back(engine.Allreduce("parallel", parallel, parallel, ReduceOp::kAdasum));
    handles.push_back(engine.Allreduce("orthogonal", orthogonal, orthogonal, ReduceOp::kAdasum));
    for (Handle& h : handles) h.Wait();
    EXPECT_EQ(mixed.ToVector(), want) << "rank " << rank;
    for (float v : parallel.ToVector()) EXPECT_NEAR(v, 2.5f, 1e-6) << "rank " << rank;
    const std::vector<float> summed = orthogonal.ToVector();
    for (int i = 0; i < kRanks; ++i) EXPECT_NEAR(summed[i], i + 1.0f, 1e-6) << "rank " << rank;
  });
}

TEST(Engine, AdasumRefusesWhatItCannotCombineAtOnce) {
  RunRanks(3, [](Engine& engine, int) {
    Array a = Filled(4, 1.0f);
    try {
      engine.Allreduce("three", a, a, ReduceOp::kAdasum);
      ADD_FAILURE() << "3 ranks accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("power-of-two number of ranks; this job (or process "
                                           "set) has 3"),
                std::string::npos)
          << e.what();
    }
  });
  RunRanks(2, [](Engine& engine, int) {
    Array b({4}, DType::kBFloat16);
    EXPECT_THROW(engine.Allreduce("bf16", b, b, ReduceOp::kAdasum), InvalidArgument);
    Array a = Filled(4, 1.0f);
    EXPECT_THROW(engine.Reducescatter("rs", a, ReduceOp::kAdasum), InvalidArgument);
    engine.Allreduce("ok", a, a, ReduceOp::kAdasum).Wait();  // the engine goes on
    EXPECT_EQ(a.ToVector(), std::vector<float>(4, 1.0f));    // parallel (equal): their mean
  });
}

}  // namespace
}  // namespace dtrain::collectives

// Whole dist KVStore jobs in one process, with failures injected through the in-memory network:
// crashed workers, servers and schedulers, cut links, lost messages, surplus workers, workers that
// leave early. Each must end in a clear error naming the node (role rank (address)) or what was
// waited for, well before the request deadline, and the job must end (no thread outlives a test).
#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/common/array.h"
#include "inprocess_job.h"

namespace dtrain::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Failure detection must beat the request deadline by far: it comes from peer-loss reports and
// heartbeats, not from requests timing out.
constexpr Duration kPrompt{4000};

Config FailureConfig(int servers, int workers) {
  Config c = InMemoryJobConfig(servers, workers);
  c.heartbeat_interval = 100ms;
  c.heartbeat_timeout = 2000ms;  // how long a crashed node takes to notice it is alone
  c.request_timeout = 8000ms;
  return c;
}

// Counts arrivals, so that a test can act once the others are blocked where it wants them.
class Arrivals {
 public:
  void Arrive() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
    cv_.notify_all();
  }
  bool WaitFor(int n, Duration timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return count_ >= n; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_ = 0;
};

// PushPull of key 0 round after round until an operation throws. `at_round` runs at the start of
// each round and returns false to stop this worker there; `issued` is told when a worker has
// issued round `mark` (so that another can act while it waits in it).
void RoundsUntilFailure(DistKVStore& kv, const std::function<bool(int)>& at_round,
                        Arrivals* issued = nullptr, int mark = -1) {
  kv.Init(0, Array({3000}));  // split over every server in several slots
  Array grad({3000});
  Array out({3000});
  for (int round = 0; round < 10000; ++round) {
    if (!at_round(round)) return;
    Operation op = kv.PushPull(0, {grad}, {out});
    if (round == mark && issued != nullptr) issued->Arrive();
    op.Wait();
  }
  ADD_FAILURE() << "rank " << kv.rank() << " never saw the failure";
}

TEST(DistJobFailure, CrashedWorkerIsNamedToEveryOtherNode) {
  InProcessJob job("dist_sync", FailureConfig(2, 3));
  constexpr int kRound = 5;
  Arrivals issued;
  Clock::time_point crashed_at;
  job.Run([&](DistKVStore& kv) {
    RoundsUntilFailure(
        kv,
        [&](int round) {
          if (kv.rank() != 1 || round != kRound) return true;
          // The others are waiting in this round, for worker 1's push.
          EXPECT_TRUE(issued.WaitFor(2, 5000ms));
          crashed_at = Clock::now();
          job.CrashWorker(1);
          return false;
        },
        &issued, kRound);
  });
  for (int w : {0, 2}) {
    const WorkerOutcome& o = job.worker(w);
    EXPECT_EQ(o.error_kind, "PeerError") << job.Summary();
    EXPECT_THAT(o.error, HasSubstr("worker 1 (inmem:" + std::to_string(job.worker_port(1)) + ")"));
    EXPECT_THAT(o.error, HasSubstr("crashed"));
    EXPECT_LT(o.failed_at - crashed_at, kPrompt) << o.error;
  }
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(job.cluster().server_code(s), 1);
    EXPECT_THAT(job.cluster().server_failure(s), HasSubstr("worker 1 (inmem:"));
  }
  EXPECT_EQ(job.cluster().scheduler_code(), 1);
}

TEST(DistJobFailure, CrashedServerIsNamedToTheWorkers) {
  InProcessJob job("dist_sync", FailureConfig(2, 2));
  constexpr int kRound = 5;
  Arrivals issued;
  Clock::time_point crashed_at;
  job.Run([&](DistKVStore& kv) {
    RoundsUntilFailure(
        kv,
        [&](int round) {
          if (kv.rank() == 0 && round == kRound + 1) {
            // Both workers have issued round kRound: crash server 0 under them.
            EXPECT_TRUE(issued.WaitFor(2, 5000ms));
            crashed_at = Clock::now();
            job.cluster().Crash(job.cluster().server_port(0));
          }
          return true;
        },
        &issued, kRound);
  });
  for (int w : {0, 1}) {
    const WorkerOutcome& o = job.worker(w);
    EXPECT_EQ(o.error_kind, "PeerError") << job.Summary();
    EXPECT_THAT(o.error,
                HasSubstr("server 0 (inmem:" + std::to_string(job.cluster().server_port(0)) + ")"));
    EXPECT_LT(o.failed_at - crashed_at, kPrompt) << o.error;
  }
  EXPECT_EQ(job.cluster().server_code(0), 1);
  EXPECT_EQ(job.cluster().server_code(1), 1);
  EXPECT_THAT(job.cluster().server_failure(1), HasSubstr("server 0 (inmem:"));
  EXPECT_EQ(job.cluster().scheduler_code(), 1);
}

TEST(DistJobFailure, CrashedSchedulerIsNamedToEveryone) {
  InProcessJob job("dist_sync", FailureConfig(1, 2));
  Clock::time_point crashed_at;
  job.Run([&](DistKVStore& kv) {
    RoundsUntilFailure(kv, [&](int round) {
      if (kv.rank() == 0 && round == 3) {
        crashed_at = Clock::now();
        job.cluster().Crash(job.cluster().scheduler_port());
      }
      return true;
    });
  });
  const std::string scheduler =
      "scheduler (inmem:" + std::to_string(job.cluster().scheduler_port());
  for (int w : {0, 1}) {
    const WorkerOutcome& o = job.worker(w);
    EXPECT_EQ(o.error_kind, "PeerError") << job.Summary();
    EXPECT_THAT(o.error, HasSubstr(scheduler));
    EXPECT_LT(o.failed_at - crashed_at, kPrompt) << o.error;
  }
  EXPECT_EQ(job.cluster().server_code(0), 1);
  EXPECT_THAT(job.cluster().server_failure(0), HasSubstr(scheduler));
  EXPECT_EQ(job.cluster().scheduler_code(), 1);  // once it notices everyone is silent
}

TEST(DistJobFailure, CutLinkFailsBothEndsAndThenTheJob) {
  const Config config = FailureConfig(1, 2);
  InProcessJob job("dist_sync", config);
  const transport::NodeId worker1 = 1 + 1 + 1, server0 = 1;
  std::atomic<bool> armed{false};
  std::atomic<Clock::rep> cut_at{0};
  job.network().SetFilter([&](transport::NodeId from, transport::NodeId to, const auto& msg) {
    if (armed && from == worker1 && to == server0 &&
        msg.header.command != transport::Command::kPull) {
      cut_at = Clock::now().time_since_epoch().count();
      return transport::FaultAction::Cut();
    }
    return transport::FaultAction::Deliver();
  });
  job.Run([&](DistKVStore& kv) {
    RoundsUntilFailure(kv, [&](int round) {
      if (kv.rank() == 1 && round == 4) armed = true;
      return true;
    });
  });
  const Clock::time_point cut(Clock::duration(cut_at.load()));
  ASSERT_NE(cut_at.load(), 0) << "the filter never cut anything";
  const WorkerOutcome& w1 = job.worker(1);
  EXPECT_EQ(w1.error_kind, "PeerError") << job.Summary();
  EXPECT_THAT(w1.error, HasSubstr("server 0 (inmem:"));
  EXPECT_THAT(w1.error, HasSubstr("cut"));
  EXPECT_LT(w1.failed_at - cut, kPrompt);
  EXPECT_EQ(job.cluster().server_code(0), 1);
  EXPECT_THAT(job.cluster().server_failure(0), HasSubstr("worker 1 (inmem:"));
  // Worker 0 is told by the scheduler, which finds the two silent within PS_HEARTBEAT_TIMEOUT.
  const WorkerOutcome& w0 = job.worker(0);
  EXPECT_EQ(w0.error_kind, "PeerError") << job.Summary();
  EXPECT_THAT(w0.error, AnyOf(HasSubstr("server 0 (inmem:"), HasSubstr("worker 1 (inmem:")));
  EXPECT_LT(w0.failed_at - cut, config.heartbeat_timeout + kPrompt) << w0.error;
  EXPECT_EQ(job.cluster().scheduler_code(), 1);
}

TEST(DistJobFailure, LostPushIsATimeoutNamingTheOperationAndTheJobStillEnds) {
  Config config = InMemoryJobConfig(1, 1);
  config.request_timeout = 1000ms;
  InProcessJob job("dist_sync", config);
  std::atomic<bool> dropped{false};
  job.network().SetFilter([&](transport::NodeId, transport::NodeId, const auto& msg) {
    if (msg.header.command == transport::Command::kPush && msg.header.key == 5 &&
        !dropped.exchange(true)) {
      return transport::FaultAction::Drop();
    }
    return transport::FaultAction::Deliver();
  });
  job.Run([&](DistKVStore& kv) {
    kv.Init(std::vector<Key>{5, 6}, std::vector<Array>{Array({10}), Array({10})});
    Array ones({10});
    ones.Fill(1.0f);
    const auto start = Clock::now();
    try {
      kv.Push(5, {ones}).Wait();
      ADD_FAILURE() << "a push that never arrived finished";
    } catch (const TimeoutError& e) {
      // It names the key and the server it waits on.
      EXPECT_THAT(e.what(), HasSubstr("push of key 5 on server "));
      EXPECT_THAT(e.what(), HasSubstr(" did not finish within 1"));
      EXPECT_THAT(e.what(), HasSubstr("DTRAIN_REQUEST_TIMEOUT_MS"));
      EXPECT_THAT(e.what(), HasSubstr("1 part(s) still outstanding"));
    }
    const auto took = Clock::now() - start;
    EXPECT_GE(took, 900ms);
    EXPECT_LT(took, 3000ms);
    // Other keys still work.
    Array out({10});
    kv.PushPull(6, {ones}, {out}).Wait();
    EXPECT_EQ(out.floats()[9], 1.0f);
  });
  EXPECT_TRUE(dropped.load());
  // The worker left in order despite the operation it gave up on: the job ends cleanly.
  job.ExpectSuccess();
}

TEST(DistJobFailure, SchedulerThatNeverStartsIsATimeoutNamingItsAddress) {
  auto network = std::make_shared<transport::InMemoryNetwork>();
  Config config = InMemoryJobConfig(1, 1);
  config.scheduler_port = 4321;  // nothing listens there
  config.connect_timeout = 300ms;
  const auto start = Clock::now();
  try {
    DistKVStore kv("dist_sync", config, std::make_unique<transport::InMemoryTransport>(network),
                   false);
    ADD_FAILURE() << "joined a job without a scheduler";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot reach the scheduler at inmem:4321"));
  }
  EXPECT_LT(Clock::now() - start, 3000ms);
}

TEST(DistJobFailure, SurplusWorkerIsRefusedAndTheJobGoesOn) {
  InProcessJob job("dist_sync", InMemoryJobConfig(1, 2));
  job.Run([&](DistKVStore& kv) {
    kv.Init(0, Array({4}));
    if (kv.rank() == 0) {
      try {
        DistKVStore third("dist_sync", job.cluster().NodeConfig(Role::kWorker, -1),
                          job.cluster().NewTransport(), false);
        ADD_FAILURE() << "a third worker joined a job of two";
      } catch (const PeerError& e) {
        EXPECT_THAT(e.what(), HasSubstr("the job already has its 2 worker(s) (DMLC_NUM_WORKER)"));
      }
    }
    Array one({4}), out({4});
    one.Fill(1.0f);
    kv.PushPull(0, {one}, {out}).Wait();
    EXPECT_EQ(out.floats()[0], 2.0f);
  });
  job.ExpectSuccess();
}

class LeaveDuringBarrierTest : public ::testing::TestWithParam<bool> {};

// A worker that finishes while another waits at a barrier fails the job at once, whichever
// reaches the scheduler first: worker 0's barrier or worker 1's finish. The order is made, not
// hoped for: each side acts only once the network has carried the other's message, and the
// network's own record of the two messages proves which came first.
TEST_P(LeaveDuringBarrierTest, EveryoneErrorsInsteadOfWaiting) {
  const bool barrier_first = GetParam();
  InProcessJob job("dist_sync", FailureConfig(1, 2));
  std::mutex mutex;
  std::condition_variable carried;
  // Worker 0's barrier after its Init (Init has barriers of its own) and worker 1's finish, as the
  // network carried them. Ids: scheduler 0, server 1, workers 2 and 3.
  std::vector<transport::Command> order;
  const transport::NodeId worker0 = 2, worker1 = 3;
  std::atomic<bool> worker0_initialised{false};
  job.network().SetFilter(
      [&](transport::NodeId from, transport::NodeId, const transport::Message& msg) {
        const auto command = msg.header.command;
        if ((command == transport::Command::kBarrier && from == worker0 && worker0_initialised) ||
            (command == transport::Command::kFinish && from == worker1)) {
          std::lock_guard<std::mutex> lock(mutex);
          order.push_back(command);
          carried.notify_all();
        }
        return transport::FaultAction::Deliver();
      });
  auto wait_for = [&](transport::Command command) {
    std::unique_lock<std::mutex> lock(mutex);
    return carried.wait_for(
        lock, 10s, [&] { return std::find(order.begin(), order.end(), command) != order.end(); });
  };
  Clock::time_point left_at;
  job.Run([&](DistKVStore& kv) {
    kv.Init(0, Array({4}));
    if (kv.rank() == 1) {
      if (barrier_first) {
        ASSERT_TRUE(wait_for(transport::Command::kBarrier));
      }
      left_at = Clock::now();
      return;  // the destructor tells the scheduler this worker is done
    }
    worker0_initialised = true;
    if (!barrier_first) {
      ASSERT_TRUE(wait_for(transport::Command::kFinish));
    }
    kv.Barrier();
    ADD_FAILURE() << "passed a barrier that worker 1 never reached";
  });
  {
    std::lock_guard<std::mutex> lock(mutex);
    ASSERT_GE(order.size(), 2u);
    EXPECT_EQ(order[0], barrier_first ? transport::Command::kBarrier : transport::Command::kFinish);
  }
  const WorkerOutcome& w0 = job.worker(0);
  EXPECT_EQ(w0.error_kind, "PeerError") << job.Summary();
  EXPECT_THAT(w0.error, HasSubstr("worker 1 (inmem:"));
  EXPECT_THAT(w0.error, HasSubstr("finished the job while the others wait at a barrier"));
  EXPECT_LT(w0.failed_at - left_at, kPrompt);
  EXPECT_EQ(job.cluster().server_code(0), 1);
  EXPECT_EQ(job.cluster().scheduler_code(), 1);
}

INSTANTIATE_TEST_SUITE_P(Orders, LeaveDuringBarrierTest, ::testing::Bool(), [](const auto& info) {
  return info.param ? "BarrierFirst" : "LeaveFirst";
});

// In dist_sync a round needs every worker: once one has left, the others' pushes are refused
// naming it, and the job still ends in order when they leave too.
TEST(DistJobFailure, PushAfterAWorkerLeftIsRefusedNamingItAndTheJobEnds) {
  InProcessJob job("dist_sync", InMemoryJobConfig(1, 2));
  const auto start = Clock::now();
  job.Run([&](DistKVStore& kv) {
    if (kv.rank() == 1) {
      kv.Init(0, Array({3000}));  // as RoundsUntilFailure does, then leave
      return;
    }
    RoundsUntilFailure(kv, [](int) { return true; });
  });
  const WorkerOutcome& w0 = job.worker(0);
  EXPECT_EQ(w0.error_kind, "PeerError") << job.Summary();
  EXPECT_THAT(w0.error, HasSubstr("server 0 (inmem:"));
  EXPECT_THAT(w0.error, HasSubstr("worker 1 has finished the job"));
  EXPECT_LT(Clock::now() - start, 5000ms) << "the job did not end when both workers had left";
  EXPECT_EQ(job.cluster().server_code(0), 0) << job.Summary();
  EXPECT_EQ(job.cluster().scheduler_code(), 0) << job.Summary();
}

// The harness itself: a job that would wait far beyond the hang guard is failed at the guard and
// ended, rather than left to block.
TEST(InProcessJobHarness, HungJobFailsAtTheGuardAndEnds) {
  Config config = InMemoryJobConfig(1, 1);
  config.request_timeout = 60000ms;
  config.heartbeat_timeout = 2000ms;
  InProcessJob job("dist_sync", config, /*hang_guard=*/1500ms);
  job.network().SetFilter([](transport::NodeId, transport::NodeId, const auto& msg) {
    return msg.header.command == transport::Command::kPush ? transport::FaultAction::Drop()
                                                           : transport::FaultAction::Deliver();
  });
  const auto start = Clock::now();
  EXPECT_NONFATAL_FAILURE(job.Run([](DistKVStore& kv) {
    kv.Init(0, Array({4}));
    kv.Push(0, {Array({4})}).Wait();  // never answered
  }),
                          "the job hung");
  EXPECT_LT(Clock::now() - start, 10000ms);
  EXPECT_THAT(job.worker(0).error, HasSubstr("scheduler (inmem:"));
}

}  // namespace
}  // namespace dtrain::testing

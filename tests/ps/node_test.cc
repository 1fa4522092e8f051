// Node and Scheduler over the in-memory transport: joining a job, refusals, start deadlines,
// heartbeats and the detection of a node gone silent. Workers here are bare Nodes.
#include "ps/node/node.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "dtrain/common/error.h"
#include "inprocess_cluster.h"
#include "ps/scheduler.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using transport::InMemoryTransport;

// A worker as a bare Node of `cluster`'s job.
std::unique_ptr<ps::Node> WorkerNode(InProcessCluster& cluster, int rank) {
  return std::make_unique<ps::Node>(cluster.NodeConfig(Role::kWorker, rank), Role::kWorker,
                                    cluster.NewTransport(), ps::Node::Options{});
}

// Runs `fn`, which must throw E; returns its message ("" and a test failure if it did not throw).
template <typename E, typename F>
std::string MessageOf(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong kind of error: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

TEST(NodeJoin, SchedulerThatNeverStartsIsATimeoutNamingItsAddress) {
  auto network = std::make_shared<transport::InMemoryNetwork>();
  Config config = InMemoryJobConfig(1, 1);
  config.scheduler_port = 4321;  // nothing listens there
  config.connect_timeout = std::chrono::milliseconds(300);
  ps::Node node(config, Role::kWorker, std::make_unique<InMemoryTransport>(network), {});
  const auto start = Clock::now();
  const std::string what = MessageOf<TimeoutError>([&] { node.Start(); });
  EXPECT_THAT(what, HasSubstr("cannot reach the scheduler at inmem:4321"));
  EXPECT_THAT(what, HasSubstr("DMLC_PS_ROOT_URI"));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

// A node that registers when the job is already complete gets a refusal naming the variable.
struct Extra {
  Role role;
  std::string expected;
};

class NodeRefusalTest : public ::testing::TestWithParam<Extra> {};

TEST_P(NodeRefusalTest, ExtraNodeIsRefusedClearlyAndTheJobGoesOn) {
  InProcessCluster cluster(InMemoryJobConfig(1, 2));
  cluster.StartScheduler();
  cluster.StartServers();
  for (int w = 0; w < 2; ++w) {
    cluster.Spawn("worker " + std::to_string(w), [&cluster, w] {
      auto node = WorkerNode(cluster, w);
      node->Start();
      if (w == 0) {
        // The job has started: every place is taken.
        ps::Node extra(cluster.NodeConfig(GetParam().role, -1), GetParam().role,
                       cluster.NewTransport(), {});
        const auto start = Clock::now();
        const std::string what = MessageOf<PeerError>([&] { extra.Start(); });
        EXPECT_THAT(what, HasSubstr(GetParam().expected));
        EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
      }
      node->Barrier(ps::Group::kWorkers);  // the job still works
      node->Finish();
    });
  }
  cluster.Finish();
  EXPECT_EQ(cluster.scheduler_code(), 0);
  EXPECT_EQ(cluster.server_code(0), 0) << cluster.server_failure(0);
}

INSTANTIATE_TEST_SUITE_P(
    Roles, NodeRefusalTest,
    ::testing::Values(Extra{Role::kWorker, "the job already has its 2 worker(s) (DMLC_NUM_WORKER)"},
                      Extra{Role::kServer, "the job already has its 1 server(s) (DMLC_NUM_SERVER)"},
                      Extra{Role::kScheduler, "a job has only one scheduler"}),
    [](const auto& info) { return std::string(RoleName(info.param.role)); });

TEST(NodeJoin, JobThatNeverCompletesIsStoppedByTheSchedulerAtItsStartDeadline) {
  Config config = InMemoryJobConfig(1, 2);
  config.start_timeout = std::chrono::milliseconds(800);
  InProcessCluster cluster(config);
  cluster.StartScheduler();
  // The other nodes would wait longer: the scheduler's refusal is what ends their wait.
  cluster.Tune([](Config& c) { c.start_timeout = std::chrono::milliseconds(4000); });
  cluster.StartServers();
  std::string what;
  cluster.Spawn("worker 0", [&] {
    auto node = WorkerNode(cluster, 0);  // worker 1 never comes
    const auto start = Clock::now();
    what = MessageOf<PeerError>([&] { node->Start(); });
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(3000));
  });
  cluster.Finish();
  EXPECT_THAT(what, HasSubstr("the scheduler stopped the job: the job did not start within"));
  EXPECT_THAT(what, HasSubstr("1 of 1 servers and 1 of 2 workers registered"));
  EXPECT_EQ(cluster.scheduler_code(), 1);
  EXPECT_EQ(cluster.server_code(0), 1);
  EXPECT_THAT(cluster.server_failure(0), HasSubstr("1 of 2 workers registered"));
}

// Heartbeats keep to their interval: an idle job exchanges a few messages a second, not a storm.
TEST(NodeHeartbeat, IdleJobSendsFewMessages) {
  Config config = InMemoryJobConfig(1, 1);
  config.heartbeat_interval = std::chrono::milliseconds(100);
  InProcessCluster cluster(config);
  cluster.StartScheduler();
  cluster.StartServers();
  uint64_t idle_messages = 0;
  cluster.Spawn("worker 0", [&] {
    auto node = WorkerNode(cluster, 0);
    node->Start();
    const uint64_t before = cluster.network().delivered();
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    idle_messages = cluster.network().delivered() - before;
    node->Finish();
  });
  cluster.Finish();
  // Two nodes, ten beats a second each, and an answer to each: about 40.
  EXPECT_LT(idle_messages, 200u) << "heartbeats do not keep to PS_HEARTBEAT_INTERVAL";
  EXPECT_EQ(cluster.scheduler_code(), 0);
}

// A node whose messages all vanish (its host is cut off without a reset) is found by the
// scheduler's heartbeat check, however busy the others keep the scheduler.
TEST(NodeHeartbeat, SchedulerNamesANodeThatFellSilent) {
  Config config = InMemoryJobConfig(1, 3);
  config.heartbeat_interval = std::chrono::milliseconds(100);
  config.heartbeat_timeout = std::chrono::milliseconds(1500);
  config.request_timeout = std::chrono::milliseconds(8000);
  InProcessCluster cluster(config);
  const transport::NodeId silent = 1 + 1 + 1;  // worker 1 of a job with one server
  std::atomic<bool> cut{false};
  cluster.network().SetFilter([&](transport::NodeId from, transport::NodeId, const auto&) {
    return cut && from == silent ? transport::FaultAction::Drop()
                                 : transport::FaultAction::Deliver();
  });
  cluster.StartScheduler();
  cluster.StartServers();
  std::vector<std::string> errors(3);
  std::vector<Clock::duration> took(3);
  for (int w = 0; w < 3; ++w) {
    cluster.Spawn("worker " + std::to_string(w), [&, w] {
      auto node = WorkerNode(cluster, w);
      node->Start();
      node->Barrier(ps::Group::kWorkers);
      if (w == 1) cut = true;
      const auto start = Clock::now();
      try {
        node->Barrier(ps::Group::kWorkers);  // worker 1's arrival never gets through
        ADD_FAILURE() << "worker " << w << " passed a barrier that a silent worker missed";
      } catch (const Error& e) {
        errors[w] = e.what();
      }
      took[w] = Clock::now() - start;
    });
  }
  cluster.Finish();
  for (int w : {0, 2}) {
    EXPECT_THAT(errors[w], HasSubstr("worker 1 (inmem:")) << "worker " << w;
    EXPECT_THAT(errors[w], HasSubstr("heartbeat")) << "worker " << w;
    EXPECT_LT(took[w], std::chrono::milliseconds(5000)) << "worker " << w << ": " << errors[w];
  }
  EXPECT_FALSE(errors[1].empty());
  EXPECT_EQ(cluster.scheduler_code(), 1);
  EXPECT_EQ(cluster.server_code(0), 1);
  EXPECT_THAT(cluster.server_failure(0), HasSubstr("worker 1 (inmem:"));
}

// At the end of a job a worker exits as soon as it has its kTerminate; a server may see that
// worker's link close before its own kTerminate arrives (another connection). That is no failure.
TEST(NodeEnd, AWorkerGoneBeforeTheServersTerminateIsNoFailure) {
  InProcessCluster cluster(InMemoryJobConfig(1, 1));
  const transport::NodeId server0 = 1;
  std::atomic<int> delayed{0};
  cluster.network().SetFilter([&](transport::NodeId, transport::NodeId to, const auto& msg) {
    if (to == server0 && msg.header.command == transport::Command::kTerminate) {
      ++delayed;
      return transport::FaultAction::Delay(std::chrono::milliseconds(500));
    }
    return transport::FaultAction::Deliver();
  });
  cluster.StartScheduler();
  cluster.StartServers();
  cluster.Spawn("worker 0", [&] {
    auto node = WorkerNode(cluster, 0);
    node->Start();
    node->Finish();
    cluster.network().Crash(node->self().port);  // the process exits without a goodbye
  });
  cluster.Finish();
  EXPECT_EQ(delayed.load(), 1);
  EXPECT_EQ(cluster.server_code(0), 0) << cluster.server_failure(0);
  EXPECT_EQ(cluster.scheduler_code(), 0);
}

// The workers' group: a round completes only once both workers arrived (worker 1 always later).
TEST(NodeBarrier, TheWorkersGroupCompletesOnlyWithEveryWorker) {
  InProcessCluster cluster(InMemoryJobConfig(1, 2));
  cluster.StartScheduler();
  cluster.StartServers();
  std::atomic<int> arrived{0};
  for (int w = 0; w < 2; ++w) {
    cluster.Spawn("worker " + std::to_string(w), [&, w] {
      auto node = WorkerNode(cluster, w);
      node->Start();
      EXPECT_EQ(node->self().rank, w);
      EXPECT_EQ(node->self().id, node->layout().WorkerId(w));
      EXPECT_THAT(node->NameOf(node->layout().ServerId(0)), HasSubstr("server 0 (inmem:"));
      for (int round = 0; round < 3; ++round) {
        if (w == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        arrived.fetch_add(1);
        node->Barrier(ps::Group::kWorkers);
        EXPECT_GE(arrived.load(), 2 * (round + 1));
      }
      node->Finish();
    });
  }
  cluster.Finish();
  EXPECT_EQ(cluster.scheduler_code(), 0);
  EXPECT_EQ(cluster.server_code(0), 0) << cluster.server_failure(0);
}

}  // namespace
}  // namespace dtrain::testing

// A worker built by hand from Node + WorkerClient + KeyPartition, against a real scheduler and real
// servers: slots placed by KeyPartition are served by the servers they name, replies are written
// straight into the caller's memory, refusals and failures reach the request's callback naming
// the server and the problem.
#include "ps/worker_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "inprocess_cluster.h"
#include "ps/key_partition.h"
#include "raw_peer.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using transport::Body;
using transport::Command;
using transport::Message;

struct Result {
  bool replied = false;      // the callback ran in time
  std::string error;         // "" on success
  Body body;                 // the reply's body
  bool synchronous = false;  // the callback ran before Request returned
};

// A worker node of `cluster` with its client; Start it on the worker's thread.
struct RawWorker {
  RawWorker(InProcessCluster& cluster, int rank)
      : node(cluster.NodeConfig(Role::kWorker, rank), Role::kWorker, cluster.NewTransport(), {}),
        client(node) {}
  // The node's transport thread calls into the client: stop it before the client goes.
  ~RawWorker() { node.Shutdown(); }

  // Sends one request and waits (bounded) for its callback.
  Result Call(int server, Command command, uint64_t key, uint32_t part, std::string meta = {},
              Body body = {}, Body reply_into = {}) {
    Message m;
    m.header.command = command;
    m.header.key = key;
    m.header.part = part;
    m.meta = std::move(meta);
    m.body = std::move(body);
    auto result = std::make_shared<Result>();
    auto done = std::make_shared<std::promise<void>>();
    auto returned = std::make_shared<std::atomic<bool>>(false);
    client.Request(server, std::move(m), std::move(reply_into),
                   [result, done, returned](const Message* reply, std::exception_ptr error) {
                     result->synchronous = !returned->load();
                     if (error) {
                       try {
                         std::rethrow_exception(error);
                       } catch (const std::exception& e) {
                         result->error = e.what();
                       }
                     } else {
                       result->body = reply->body;
                     }
                     done->set_value();
                   });
    returned->store(true);
    if (done->get_future().wait_for(std::chrono::seconds(10)) == std::future_status::ready) {
      result->replied = true;
    }
    return *result;
  }

  ps::Node node;
  ps::WorkerClient client;
};

Body Slice(const std::vector<float>& v, int64_t offset, int64_t length) {
  Body b;
  b.data = reinterpret_cast<char*>(const_cast<float*>(v.data() + offset));
  b.size = static_cast<size_t>(length) * sizeof(float);
  return b;
}

std::string InitMeta(int64_t length) {
  return nlohmann::json{{"length", length}, {"sync", true}}.dump();
}

TEST(WorkerClient, SlotsOfASplitKeyRoundTripIntoTheCallersMemory) {
  Config config = InMemoryJobConfig(2, 1);
  config.bigarray_bound = 1000;
  config.chunk_bytes = 1024;
  InProcessCluster cluster(config);
  cluster.StartScheduler();
  cluster.StartServers();
  cluster.Spawn("worker 0", [&] {
    RawWorker w(cluster, 0);
    w.node.Start();
    ps::KeyPartition partition(2, config.bigarray_bound, config.chunk_bytes);
    const int64_t n = 3001;
    const auto& slots = partition.Add(3, n, DType::kFloat32);
    std::set<int> servers;
    std::vector<float> value(n), pushed(n), pulled(n, -1.0f);
    for (int64_t i = 0; i < n; ++i) {
      value[i] = static_cast<float>(i % 11);
      pushed[i] = static_cast<float>(i);
    }
    for (const auto& s : slots) {
      servers.insert(s.server);
      auto r = w.Call(s.server, Command::kInit, 3, s.part, InitMeta(s.length),
                      Slice(value, s.offset, s.length));
      ASSERT_TRUE(r.replied);
      ASSERT_EQ(r.error, "") << "init of part " << s.part;
    }
    EXPECT_EQ(servers, (std::set<int>{0, 1})) << "a big key is split over both servers";
    for (const auto& s : slots) {
      auto r = w.Call(s.server, Command::kPush, 3, s.part, {}, Slice(pushed, s.offset, s.length));
      ASSERT_EQ(r.error, "") << "push of part " << s.part;
    }
    for (const auto& s : slots) {
      Body into = Slice(pulled, s.offset, s.length);
      auto r = w.Call(s.server, Command::kPull, 3, s.part, {}, {}, into);
      ASSERT_EQ(r.error, "") << "pull of part " << s.part;
      EXPECT_EQ(r.body.data, into.data) << "the reply was not read into the caller's memory";
    }
    EXPECT_EQ(pulled, pushed);
    w.node.Finish();
  });
  cluster.Finish();
  EXPECT_EQ(cluster.scheduler_code(), 0);
}

TEST(WorkerClient, RefusalsAndBadRepliesNameTheServerAndTheProblem) {
  InProcessCluster cluster(InMemoryJobConfig(2, 1));
  cluster.StartScheduler();
  cluster.StartServers();
  cluster.Spawn("worker 0", [&] {
    RawWorker w(cluster, 0);
    w.node.Start();
    auto r = w.Call(1, Command::kPush, 77, 0, {}, FloatBody({1, 2}));
    ASSERT_TRUE(r.replied);
    EXPECT_THAT(r.error, HasSubstr("server 1 (inmem:"));
    EXPECT_THAT(r.error, HasSubstr("refused push of key 77: key 77 was never initialised"));

    ASSERT_EQ(w.Call(0, Command::kInit, 5, 0, InitMeta(4), FloatBody({1, 2, 3, 4})).error, "");
    std::vector<float> small(3);
    r = w.Call(0, Command::kPull, 5, 0, {}, {}, Slice(small, 0, 3));
    EXPECT_THAT(r.error, HasSubstr("server 0 (inmem:"));
    EXPECT_THAT(r.error, HasSubstr("answered pull of key 5 with 16 bytes, expected 12"));
    // The client still works.
    r = w.Call(0, Command::kPull, 5, 0);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(Floats(r.body), (std::vector<float>{1, 2, 3, 4}));
    w.node.Finish();
  });
  cluster.Finish();
  EXPECT_EQ(cluster.scheduler_code(), 0);
}

TEST(WorkerClient, AFailureFailsPendingRequestsAndLaterOnesAtOnce) {
  Config config = InMemoryJobConfig(1, 1);
  config.heartbeat_timeout = std::chrono::milliseconds(1500);
  InProcessCluster cluster(config);
  std::atomic<bool> drop_pushes{false};
  cluster.network().SetFilter([&](transport::NodeId, transport::NodeId, const Message& m) {
    return drop_pushes && m.header.command == Command::kPush ? transport::FaultAction::Drop()
                                                             : transport::FaultAction::Deliver();
  });
  cluster.StartScheduler();
  cluster.StartServers();
  cluster.Spawn("worker 0", [&] {
    RawWorker w(cluster, 0);
    w.node.Start();
    ASSERT_EQ(w.Call(0, Command::kInit, 1, 0, InitMeta(1), FloatBody({0})).error, "");
    drop_pushes = true;
    // The push never arrives; crash the server while it is outstanding.
    std::thread crasher([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      cluster.Crash(cluster.server_port(0));
    });
    const auto start = Clock::now();
    auto r = w.Call(0, Command::kPush, 1, 0, {}, FloatBody({1}));
    crasher.join();
    ASSERT_TRUE(r.replied) << "a request to a crashed server was never failed";
    EXPECT_THAT(r.error, HasSubstr("server 0 (inmem:"));
    EXPECT_THAT(r.error, HasSubstr("crashed"));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
    // After the failure a request fails at once, inside Request.
    r = w.Call(0, Command::kPull, 1, 0);
    EXPECT_TRUE(r.synchronous);
    EXPECT_THAT(r.error, HasSubstr("server 0 (inmem:"));
    EXPECT_THROW(w.node.Finish(), PeerError);
  });
  cluster.Finish();
  EXPECT_EQ(cluster.scheduler_code(), 1);
  EXPECT_EQ(cluster.server_code(0), 1);
}

}  // namespace
}  // namespace dtrain::testing

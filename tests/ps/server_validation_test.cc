// Server: what it accepts and refuses, over raw messages.
//
// A real server (Node + Server, as `dtrain server` runs it) joins a job whose scheduler and worker
// are played by the test with bare transports (RawPeer), so that every field of a request can be
// chosen: keys never initialised, wrong lengths and element types, slots initialised twice,
// malformed metadata, pushes from nodes that are not workers. Each gets an error reply naming the
// problem, and the server keeps serving and ends in order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "inprocess_cluster.h"
#include "ps/node/control.h"
#include "raw_peer.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using transport::Body;
using transport::Command;
using transport::Message;

// A job of one server and one worker: the ids are fixed by the layout (node_info.h).
constexpr transport::NodeId kScheduler = 0;
constexpr transport::NodeId kServer = 1;
constexpr transport::NodeId kWorker = 2;

std::string ErrorOf(const std::optional<Message>& reply) {
  if (!reply) return "<no reply>";
  if (!reply->header.is_error()) return "<no error>";
  return reply->meta;
}

class ServerValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Config config = InMemoryJobConfig(1, 1);
    config.heartbeat_timeout = std::chrono::milliseconds(60000);  // nobody answers heartbeats here
    cluster_ = std::make_unique<InProcessCluster>(config);
    scheduler_ = std::make_unique<RawPeer>(cluster_->shared_network(), kScheduler);
    worker_ = std::make_unique<RawPeer>(cluster_->shared_network(), kWorker);
    cluster_->UseScheduler(scheduler_->Listen());
    const uint16_t worker_port = worker_->Listen();
    cluster_->StartServers();

    // Play the scheduler: take the server's registration, tell it who is who, start the job.
    auto reg = scheduler_->TakeCommand(Command::kRegister);
    ASSERT_TRUE(reg) << "the server did not register";
    const auto r = ps::control::DecodeRegistration(reg->meta);
    ASSERT_EQ(r.role, Role::kServer);
    server_port_ = r.port;
    scheduler_->Connect(kServer, server_port_);
    const std::vector<ps::NodeInfo> table = {
        {kScheduler, Role::kScheduler, 0, "inmem", scheduler_->port()},
        {kServer, Role::kServer, 0, "inmem", server_port_},
        {kWorker, Role::kWorker, 0, "inmem", worker_port}};
    Message node_table;
    node_table.header.command = Command::kNodeTable;
    node_table.meta = ps::control::EncodeNodeTable(table);
    scheduler_->Send(kServer, std::move(node_table));
    ASSERT_TRUE(scheduler_->TakeCommand(Command::kReady)) << "the server did not get ready";
    Message start;
    start.header.command = Command::kStart;
    scheduler_->Send(kServer, std::move(start));
    worker_->Connect(kServer, server_port_);
    started_ = true;
  }

  void TearDown() override {
    if (started_) {
      Message end;
      end.header.command = Command::kTerminate;
      scheduler_->Send(kServer, std::move(end));
    }
    cluster_->Finish();
    if (started_) {
      // However many requests it refused, the server ended in order.
      EXPECT_EQ(cluster_->server_code(0), 0) << cluster_->server_failure(0);
    }
    worker_.reset();
    scheduler_.reset();
    cluster_.reset();
  }

  // Sends a request to the server as `from` and returns its reply.
  std::optional<Message> Call(RawPeer& from, Command command, uint64_t key, std::string meta = {},
                              Body body = {}, DType dtype = DType::kFloat32, uint32_t part = 0) {
    Message m;
    m.header.command = command;
    m.header.key = key;
    m.header.part = part;
    m.header.dtype = dtype;
    m.header.request_id = next_request_++;
    m.meta = std::move(meta);
    m.body = std::move(body);
    const uint64_t id = m.header.request_id;
    from.Send(kServer, std::move(m));
    return from.TakeReply(id);
  }

  std::optional<Message> Init(uint64_t key, const std::vector<float>& value, bool sync = true,
                              uint32_t part = 0) {
    const std::string meta = "{\"length\":" + std::to_string(value.size()) +
                             ",\"sync\":" + (sync ? "true" : "false") + "}";
    return Call(*worker_, Command::kInit, key, meta, FloatBody(value), DType::kFloat32, part);
  }
  std::optional<Message> Push(uint64_t key, const std::vector<float>& value) {
    return Call(*worker_, Command::kPush, key, {}, FloatBody(value));
  }
  std::vector<float> Pull(uint64_t key) {
    auto reply = Call(*worker_, Command::kPull, key);
    EXPECT_EQ(ErrorOf(reply), "<no error>");
    return reply ? Floats(reply->body) : std::vector<float>{};
  }

  std::unique_ptr<InProcessCluster> cluster_;
  std::unique_ptr<RawPeer> scheduler_;
  std::unique_ptr<RawPeer> worker_;
  uint16_t server_port_ = 0;
  uint64_t next_request_ = 1;
  bool started_ = false;
};

TEST_F(ServerValidationTest, ServesWellFormedRequests) {
  EXPECT_EQ(ErrorOf(Init(1, {0, 0, 0, 0})), "<no error>");
  EXPECT_EQ(ErrorOf(Push(1, {1, 2, 3, 4})), "<no error>");
  EXPECT_EQ(Pull(1), (std::vector<float>{1, 2, 3, 4}));  // one worker: the round's sum
  auto reply = Call(*worker_, Command::kPushPull, 1, {}, FloatBody({2, 2, 2, 2}));
  ASSERT_EQ(ErrorOf(reply), "<no error>");
  EXPECT_EQ(Floats(reply->body), (std::vector<float>{2, 2, 2, 2}));
  // dist_async: every push adds to the value.
  EXPECT_EQ(ErrorOf(Init(2, {1, 1}, /*sync=*/false)), "<no error>");
  EXPECT_EQ(ErrorOf(Push(2, {1, 2})), "<no error>");
  EXPECT_EQ(ErrorOf(Push(2, {1, 2})), "<no error>");
  EXPECT_EQ(Pull(2), (std::vector<float>{3, 5}));
}

// A reply carries its request's priority, by which the server's transport orders what waits to go
// to that worker (tcp_priority_test.cc).
TEST_F(ServerValidationTest, RepliesCarryTheirRequestsPriority) {
  EXPECT_EQ(ErrorOf(Init(1, {0, 0})), "<no error>");
  for (int16_t priority : {int16_t{-7}, int16_t{3}}) {
    Message m;
    m.header.command = Command::kPushPull;
    m.header.key = 1;
    m.header.request_id = next_request_++;
    m.header.priority = priority;
    m.body = FloatBody({1, 1});
    const uint64_t id = m.header.request_id;
    worker_->Send(kServer, std::move(m));
    auto reply = worker_->TakeReply(id);
    ASSERT_EQ(ErrorOf(reply), "<no error>");
    EXPECT_EQ(reply->header.priority, priority);
  }
}

TEST_F(ServerValidationTest, RequestForAKeyNeverInitialisedIsRefused) {
  EXPECT_THAT(ErrorOf(Push(7, {1, 2, 3, 4})), HasSubstr("key 7 was never initialised"));
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kPull, 7, {}, {}, DType::kFloat32, 3)),
              HasSubstr("key 7 part 3 was never initialised"));
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kPushPull, 7, {}, FloatBody({1}))),
              HasSubstr("key 7 was never initialised"));
  // Still serving.
  EXPECT_EQ(ErrorOf(Init(7, {0, 0, 0, 0})), "<no error>");
  EXPECT_EQ(ErrorOf(Push(7, {1, 2, 3, 4})), "<no error>");
  EXPECT_EQ(Pull(7), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(ServerValidationTest, PushOfTheWrongLengthIsRefused) {
  ASSERT_EQ(ErrorOf(Init(1, {0, 0, 0, 0})), "<no error>");
  EXPECT_THAT(ErrorOf(Push(1, {1, 2, 3})),
              HasSubstr("push to key 1 carries 3 float32 elements; it holds 4 float32"));
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kPushPull, 1, {}, FloatBody({1, 2, 3, 4, 5}))),
              HasSubstr("pushpull to key 1 refused: its body of 20 bytes is more than the 16 "
                        "expected here (it holds 4 float32)"));
  EXPECT_THAT(ErrorOf(Push(1, {})), HasSubstr("carries 0 float32 elements"));
  // A refused push is not part of the round.
  EXPECT_EQ(ErrorOf(Push(1, {1, 2, 3, 4})), "<no error>");
  EXPECT_EQ(Pull(1), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(ServerValidationTest, PushOfTheWrongElementTypeIsRefused) {
  ASSERT_EQ(ErrorOf(Init(1, {0, 0, 0, 0})), "<no error>");
  // Same byte count as the slot (16), other types.
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kPush, 1, {}, ZeroBody(16), DType::kFloat64)),
              HasSubstr("push to key 1 carries 2 float64 elements; it holds 4 float32"));
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kPush, 1, {}, ZeroBody(16), DType::kFloat16)),
              HasSubstr("carries 8 float16 elements; it holds 4 float32"));
  EXPECT_EQ(ErrorOf(Push(1, {4, 3, 2, 1})), "<no error>");
  EXPECT_EQ(Pull(1), (std::vector<float>{4, 3, 2, 1}));
}

TEST_F(ServerValidationTest, InitOfASlotTwiceIsRefusedAndKeepsTheFirstValue) {
  ASSERT_EQ(ErrorOf(Init(1, {1, 2, 3, 4})), "<no error>");
  EXPECT_THAT(ErrorOf(Init(1, {9, 9, 9, 9})), HasSubstr("key 1 is already initialised"));
  EXPECT_THAT(ErrorOf(Init(1, {9, 9})), HasSubstr("key 1 is already initialised"));
  EXPECT_EQ(Pull(1), (std::vector<float>{1, 2, 3, 4}));
  // Another part of the same key is another slot.
  EXPECT_EQ(ErrorOf(Init(1, {5, 6}, true, /*part=*/1)), "<no error>");
  EXPECT_THAT(ErrorOf(Init(1, {5, 6}, true, /*part=*/1)),
              HasSubstr("key 1 part 1 is already initialised"));
}

struct BadInit {
  std::string meta;
  size_t body_bytes;
  std::string expected;
};

TEST_F(ServerValidationTest, MalformedInitIsRefusedAndCreatesNoSlot) {
  const std::vector<BadInit> cases = {
      {"not json", 16, "malformed init request for key 9"},
      {"", 16, "malformed init request for key 9"},
      {"[4, true]", 16, "malformed init request for key 9"},
      {R"({"length":"4","sync":true})", 16, "malformed init request for key 9"},
      {R"({"length":4})", 16, "malformed init request for key 9"},
      {R"({"sync":true})", 16, "malformed init request for key 9"},
      {R"({"length":4,"sync":1})", 16, "malformed init request for key 9"},
      {R"({"length":4.5,"sync":true})", 16, "malformed init request for key 9"},
      {R"({"length":-1,"sync":true})", 0, "announces -1 elements but carries 0 bytes"},
      {R"({"length":5,"sync":true})", 16, "announces 5 elements but carries 16 bytes"},
      {R"({"length":18446744073709551615,"sync":true})", 0, "announces -1 elements"},
      // Lengths whose size in bytes overflows 64 bits to what the body carries.
      {R"({"length":4611686018427387904,"sync":false})", 0,
       "announces 4611686018427387904 elements but carries 0 bytes"},
      {R"({"length":4611686018427387908,"sync":false})", 16,
       "announces 4611686018427387908 elements but carries 16 bytes"},
  };
  for (const BadInit& c : cases) {
    EXPECT_THAT(ErrorOf(Call(*worker_, Command::kInit, 9, c.meta, ZeroBody(c.body_bytes))),
                HasSubstr(c.expected))
        << "meta " << c.meta;
    // Nothing was created: the key is still unknown.
    EXPECT_THAT(ErrorOf(Call(*worker_, Command::kPush, 9, {}, ZeroBody(c.body_bytes))),
                HasSubstr("key 9 was never initialised"))
        << "after init with meta " << c.meta;
  }
  EXPECT_EQ(ErrorOf(Init(9, {1, 2, 3, 4})), "<no error>");
  EXPECT_EQ(Pull(9), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(ServerValidationTest, MalformedSetOptimizerIsRefusedAndChangesNothing) {
  ASSERT_EQ(ErrorOf(Init(1, {0, 0, 0, 0})), "<no error>");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "invalid optimizer spec: not valid JSON"},
      {"", "invalid optimizer spec: not valid JSON"},
      {"[1,2]", "expected a JSON object"},
      {R"({"name":"sgd"})", "\"params\" must be an object"},
      {R"({"name":"sgd","params":{"learning_rate":"fast"}})",
       "parameter 'learning_rate' of optimizer 'sgd' must be a number"},
      {R"({"name":"sgd","params":{},"extra":1})", "unexpected field 'extra'"},
      {R"({"name":"nosuch","params":{}})", "unknown optimizer 'nosuch'"},
      {R"({"name":"sgd","params":{"momentum":2}})", "momentum"},
  };
  for (const auto& [meta, expected] : cases) {
    EXPECT_THAT(ErrorOf(Call(*worker_, Command::kSetOptimizer, 0, meta)), HasSubstr(expected))
        << "spec " << meta;
  }
  // No optimizer was installed: a pull returns the round's sum.
  EXPECT_EQ(ErrorOf(Push(1, {1, 1, 1, 1})), "<no error>");
  EXPECT_EQ(Pull(1), (std::vector<float>{1, 1, 1, 1}));
  // A good spec still works: weight -= 0.5 * gradient.
  EXPECT_EQ(ErrorOf(Call(*worker_, Command::kSetOptimizer, 0,
                         R"({"name":"sgd","params":{"learning_rate":0.5}})")),
            "<no error>");
  EXPECT_EQ(ErrorOf(Push(1, {2, 2, 2, 2})), "<no error>");
  EXPECT_EQ(Pull(1), (std::vector<float>{0, 0, 0, 0}));
}

// float16 and bfloat16 keys sum on the server; an optimizer there takes float32 only, and a round
// it cannot apply fails for every request waiting on it, naming the key: it never wedges the slot
// (the workers would wait until their request timeout) nor the server's thread.
TEST_F(ServerValidationTest, ARoundThatCannotBeAppliedFailsForEveryoneAndTheSlotServesOn) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const uint64_t key = dtype == DType::kFloat16 ? 5 : 6;
    ASSERT_EQ(ErrorOf(Call(*worker_, Command::kInit, key, R"({"length":4,"sync":true})",
                           ZeroBody(8), dtype)),
              "<no error>");
    EXPECT_EQ(ErrorOf(Call(*worker_, Command::kPush, key, {}, ZeroBody(8), dtype)), "<no error>");
  }
  ASSERT_EQ(ErrorOf(Call(*worker_, Command::kSetOptimizer, 0,
                         R"({"name":"sgd","params":{"learning_rate":0.5}})")),
            "<no error>");
  for (int round = 0; round < 2; ++round) {
    EXPECT_THAT(ErrorOf(Call(*worker_, Command::kPushPull, 5, {}, ZeroBody(8), DType::kFloat16)),
                HasSubstr("applying the round of key 5 failed: optimizers support float32 values "
                          "only, key 5 is float16"))
        << "round " << round;
  }
  // float32 keys are unaffected.
  ASSERT_EQ(ErrorOf(Init(1, {1, 1, 1, 1})), "<no error>");
  EXPECT_EQ(ErrorOf(Push(1, {2, 2, 2, 2})), "<no error>");
  EXPECT_EQ(Pull(1), (std::vector<float>{0, 0, 0, 0}));
}

// A push whose body is longer than its slot is never stored (Server::BodyLimit, honoured by the
// transports): the worker gets the reason and the slot's size, and the slot serves on.
TEST_F(ServerValidationTest, APushLongerThanItsSlotIsNeverStored) {
  ASSERT_EQ(ErrorOf(Init(1, {1, 2, 3, 4})), "<no error>");
  EXPECT_EQ(ErrorOf(Push(1, std::vector<float>(1 << 18, 1.0f))),
            "push to key 1 refused: its body of 1048576 bytes is more than the 16 expected here "
            "(it holds 4 float32)");
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kPull, 1, {}, FloatBody({1}))),
              HasSubstr("pull to key 1 refused: its body of 4 bytes is more than the 0"));
  EXPECT_EQ(ErrorOf(Push(1, {1, 1, 1, 1})), "<no error>");
  EXPECT_EQ(Pull(1), (std::vector<float>{1, 1, 1, 1}));
}

TEST_F(ServerValidationTest, PushFromANodeThatIsNotAWorkerIsRefused) {
  ASSERT_EQ(ErrorOf(Init(1, {1, 2, 3, 4})), "<no error>");
  // The scheduler has a link to the server, so it hears the refusal.
  for (Command c : {Command::kPush, Command::kPushPull, Command::kPull}) {
    const std::string error = ErrorOf(Call(*scheduler_, c, 1, {}, FloatBody({5, 5, 5, 5})));
    EXPECT_THAT(error, HasSubstr("only workers push and pull; scheduler (inmem:"))
        << CommandName(c);
    EXPECT_THAT(error, HasSubstr("is not one")) << CommandName(c);
  }
  // Nothing was added to the round: the worker's push alone makes it.
  EXPECT_EQ(ErrorOf(Push(1, {1, 1, 1, 1})), "<no error>");
  EXPECT_EQ(Pull(1), (std::vector<float>{1, 1, 1, 1}));
}

TEST_F(ServerValidationTest, OtherCommandsAndStrayResponsesChangeNothing) {
  ASSERT_EQ(ErrorOf(Init(1, {1, 2, 3, 4})), "<no error>");
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kCommand, 1, "{}")), HasSubstr("malformed command"));
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kCommand, 1, R"({"cmd": "reboot"})")),
              HasSubstr("unknown command 'reboot'"));
  EXPECT_THAT(ErrorOf(Call(*worker_, Command::kCommand, 1, R"({"cmd": "get_optimizer_state"})")),
              HasSubstr("no optimizer"));
  // A message flagged as a response is not a request: no answer, no effect.
  Message stray;
  stray.header.command = Command::kPush;
  stray.header.key = 1;
  stray.header.flags = transport::kFlagResponse;
  stray.header.request_id = 999;
  stray.body = FloatBody({7, 7, 7, 7});
  worker_->Send(kServer, std::move(stray));
  EXPECT_FALSE(worker_->TakeReply(999, std::chrono::milliseconds(200)));
  EXPECT_EQ(Pull(1), (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace dtrain::testing

// InMemoryTransport keeps the Transport contract (transport.h) and adds crashes and faults.
#include "support/transport/inmemory_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain::transport {
namespace {

using namespace std::chrono_literals;

constexpr Duration kWait{10000};  // generous: the machines running tests are shared

struct Lost {
  NodeId peer;
  std::string remote;
  std::string reason;
};

// What one node received, for the test thread to wait on.
class Inbox {
 public:
  void OnMessage(Message&& msg) {
    std::lock_guard<std::mutex> lock(mutex_);
    threads_.push_back(std::this_thread::get_id());
    messages_.push_back(std::move(msg));
    changed_.notify_all();
  }
  void OnLost(NodeId peer, const std::string& remote, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    lost_.push_back({peer, remote, reason});
    changed_.notify_all();
  }
  bool WaitMessages(size_t n, Duration timeout = kWait) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return messages_.size() >= n; });
  }
  bool WaitLost(size_t n, Duration timeout = kWait) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return lost_.size() >= n; });
  }
  std::vector<Message> messages() {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }
  std::vector<Lost> lost() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lost_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Message> messages_;
  std::vector<Lost> lost_;
  std::vector<std::thread::id> threads_;
};

// One node: an inbox and a listening transport. The transport goes first on destruction, so that
// no handler runs into a destroyed inbox.
struct TestNode {
  TestNode(NodeId id, std::shared_ptr<InMemoryNetwork> network, BodySink sink = {},
           InMemoryOptions options = {})
      : id(id), transport(std::make_unique<InMemoryTransport>(std::move(network), options)) {
    transport->SetHandlers(
        [this](Message&& m) { inbox.OnMessage(std::move(m)); },
        [this](NodeId p, const std::string& r, const std::string& why) { inbox.OnLost(p, r, why); },
        std::move(sink));
    port = transport->Listen("", 0);
  }

  void ConnectTo(const TestNode& other) {
    transport->Connect(other.id, other.transport->endpoint(), id, Deadline(kWait));
  }

  NodeId id;
  Inbox inbox;
  std::unique_ptr<InMemoryTransport> transport;
  uint16_t port = 0;
};

Message MakeMessage(Command command, NodeId sender, uint64_t request_id, uint64_t key = 0,
                    std::vector<float> values = {}) {
  Message msg;
  msg.header.command = command;
  msg.header.sender = sender;
  msg.header.request_id = request_id;
  msg.header.key = key;
  if (!values.empty()) {
    auto data = std::make_shared<std::vector<float>>(std::move(values));
    msg.body.data = reinterpret_cast<char*>(data->data());
    msg.body.size = data->size() * sizeof(float);
    msg.body.owner = data;
  }
  return msg;
}

std::vector<float> BodyFloats(const Message& msg) {
  std::vector<float> out(msg.body.size / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), msg.body.data, msg.body.size);
  return out;
}

TEST(InMemoryTransportTest, TwoNodesExchangeMessages) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net);
  EXPECT_NE(a.port, b.port);
  a.ConnectTo(b);
  b.ConnectTo(a);
  EXPECT_TRUE(a.transport->IsConnected(1));
  EXPECT_FALSE(a.transport->IsConnected(2));

  Message request = MakeMessage(Command::kPush, 0, 42, 7, {1.5f, 2.5f, -3.0f});
  request.meta = "{\"shape\":[3]}";
  const char* sender_memory = request.body.data;
  a.transport->Send(1, std::move(request));
  ASSERT_TRUE(b.inbox.WaitMessages(1));
  const Message got = b.inbox.messages()[0];
  EXPECT_EQ(got.header.command, Command::kPush);
  EXPECT_EQ(got.header.sender, 0);
  EXPECT_EQ(got.header.request_id, 42u);
  EXPECT_EQ(got.header.key, 7u);
  EXPECT_EQ(got.meta, "{\"shape\":[3]}");
  EXPECT_EQ(BodyFloats(got), (std::vector<float>{1.5f, 2.5f, -3.0f}));
  EXPECT_NE(got.body.data, sender_memory);  // copied, as over a socket
  EXPECT_NE(b.inbox.threads()[0], std::this_thread::get_id());

  Message answer = MakeMessage(Command::kPush, 1, 42);
  answer.header.flags = kFlagResponse;
  b.transport->Send(0, std::move(answer));
  ASSERT_TRUE(a.inbox.WaitMessages(1));
  EXPECT_TRUE(a.inbox.messages()[0].header.is_response());
  EXPECT_TRUE(net->WaitForDelivered(2, Deadline(kWait)));
  EXPECT_EQ(net->delivered(), 2u);

  a.transport->Shutdown(Deadline(kWait));
  b.transport->Shutdown(Deadline(kWait));
  EXPECT_TRUE(a.inbox.lost().empty());
  EXPECT_TRUE(b.inbox.lost().empty());
}

TEST(InMemoryTransportTest, FourNodesAllToAllKeepOrderPerLink) {
  auto net = std::make_shared<InMemoryNetwork>();
  constexpr int kNodes = 4;
  constexpr int kPerLink = 200;
  std::vector<std::unique_ptr<TestNode>> nodes;
  for (int i = 0; i < kNodes; ++i) nodes.push_back(std::make_unique<TestNode>(i, net));
  for (auto& from : nodes) {
    for (auto& to : nodes) {
      if (from != to) from->ConnectTo(*to);
    }
  }
  // Every node sends from its own thread at once.
  std::vector<std::thread> senders;
  for (auto& from : nodes) {
    senders.emplace_back([&, node = from.get()] {
      for (int n = 0; n < kPerLink; ++n) {
        for (int to = 0; to < kNodes; ++to) {
          if (to != node->id)
            node->transport->Send(to, MakeMessage(Command::kPush, node->id, n, 0, {float(n)}));
        }
      }
    });
  }
  for (auto& t : senders) t.join();
  for (auto& node : nodes) {
    ASSERT_TRUE(node->inbox.WaitMessages((kNodes - 1) * kPerLink));
    std::vector<uint64_t> next(kNodes, 0);
    for (const Message& m : node->inbox.messages()) {
      ASSERT_NE(m.header.sender, node->id);
      EXPECT_EQ(m.header.request_id, next[m.header.sender]++)
          << "out of order from " << m.header.sender;
      EXPECT_EQ(BodyFloats(m), std::vector<float>{float(m.header.request_id)});
    }
  }
  // The count goes up once a handler has returned, a little after the inbox saw the message.
  EXPECT_TRUE(net->WaitForDelivered(kNodes * (kNodes - 1) * kPerLink, Deadline(kWait)));
  EXPECT_EQ(net->delivered(), uint64_t{kNodes * (kNodes - 1) * kPerLink});
  for (auto& node : nodes) node->transport->Shutdown(Deadline(kWait));
  for (auto& node : nodes) EXPECT_TRUE(node->inbox.lost().empty());
}

TEST(InMemoryTransportTest, LargeBodiesArriveIntact) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net);
  a.ConnectTo(b);
  constexpr size_t kFloats = size_t{16} << 20 >> 2;  // 16 MiB
  for (int round = 0; round < 3; ++round) {
    std::vector<float> values(kFloats);
    for (size_t i = 0; i < kFloats; ++i) values[i] = static_cast<float>(i % 1000003) + round;
    a.transport->Send(1, MakeMessage(Command::kPush, 0, round, 3, values));
    ASSERT_TRUE(b.inbox.WaitMessages(round + 1));
    const Message got = b.inbox.messages()[round];
    ASSERT_EQ(got.body.size, kFloats * sizeof(float));
    EXPECT_EQ(std::memcmp(got.body.data, values.data(), got.body.size), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.body.data) % 64, 0u);  // pooled buffers are aligned
  }
}

TEST(InMemoryTransportTest, BodySinkReceivesTheBody) {
  auto net = std::make_shared<InMemoryNetwork>();
  auto destination = std::make_shared<std::vector<float>>(8, 0.0f);
  std::atomic<int> sink_calls{0};
  std::atomic<size_t> sink_bytes{0};
  BodySink sink = [&, destination](const Header& header, size_t bytes) -> Body {
    ++sink_calls;
    sink_bytes = bytes;
    if (header.key != 5) return {};  // other keys: a pooled buffer
    return Body{destination, reinterpret_cast<char*>(destination->data()),
                destination->size() * sizeof(float)};
  };
  TestNode a(0, net), b(1, net, sink);
  a.ConnectTo(b);
  a.transport->Send(1, MakeMessage(Command::kPull, 0, 1, 5, {1, 2, 3, 4}));
  a.transport->Send(1, MakeMessage(Command::kPull, 0, 2, 6, {9, 9}));
  a.transport->Send(1, MakeMessage(Command::kPull, 0, 3, 5));  // no body: the sink is not asked
  ASSERT_TRUE(b.inbox.WaitMessages(3));
  const auto got = b.inbox.messages();
  EXPECT_EQ(sink_calls.load(), 2);
  EXPECT_EQ(got[0].body.data, reinterpret_cast<char*>(destination->data()));
  EXPECT_EQ(got[0].body.size, 4 * sizeof(float));  // the body's size, not the sink's
  EXPECT_EQ((std::vector<float>(destination->begin(), destination->begin() + 4)),
            (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(destination->at(4), 0.0f);
  EXPECT_NE(got[1].body.data, reinterpret_cast<char*>(destination->data()));
  EXPECT_EQ(BodyFloats(got[1]), (std::vector<float>{9, 9}));
  EXPECT_TRUE(got[2].body.empty());
}

TEST(InMemoryTransportTest, BodySinkTooSmallBreaksTheLink) {
  auto net = std::make_shared<InMemoryNetwork>();
  auto small = std::make_shared<std::vector<char>>(4);
  TestNode a(0, net);
  TestNode b(1, net, [small](const Header&, size_t) {
    return Body{small, small->data(), small->size()};
  });
  a.ConnectTo(b);
  a.transport->Send(1, MakeMessage(Command::kPush, 0, 1, 0, {1, 2}));
  ASSERT_TRUE(b.inbox.WaitLost(1));
  ASSERT_TRUE(a.inbox.WaitLost(1));
  EXPECT_NE(b.inbox.lost()[0].reason.find("body sink"), std::string::npos);
  EXPECT_TRUE(b.inbox.messages().empty());
  EXPECT_FALSE(a.transport->IsConnected(1));
}

TEST(InMemoryTransportTest, ConnectBeforeListenSucceedsWithinTheDeadline) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net);
  Inbox late_inbox;
  InMemoryTransport late(net);
  late.SetHandlers([&](Message&& m) { late_inbox.OnMessage(std::move(m)); }, nullptr);
  constexpr uint16_t kPort = 31000;
  std::thread listener([&] {
    std::this_thread::sleep_for(100ms);
    late.Listen("inmem", kPort);
  });
  const auto start = Clock::now();
  EXPECT_NO_THROW(a.transport->Connect(1, Endpoint{"inmem", kPort}, 0, Deadline(kWait)));
  EXPECT_GE(Clock::now() - start, 50ms);
  listener.join();
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 0, 1));
  EXPECT_TRUE(late_inbox.WaitMessages(1));
  late.Shutdown(Deadline(kWait));
}

TEST(InMemoryTransportTest, ConnectToNothingTimesOutNamingTheEndpoint) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net);
  const auto start = Clock::now();
  try {
    a.transport->Connect(3, Endpoint{"inmem", 31999}, 0, Deadline(Duration(150)));
    FAIL() << "Connect to nothing returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("inmem:31999"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("node 3"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 150ms);
  EXPECT_FALSE(a.transport->IsConnected(3));
}

TEST(InMemoryTransportTest, ListenRefusesATakenPort) {
  auto net = std::make_shared<InMemoryNetwork>();
  InMemoryTransport a(net), b(net), c(net);
  EXPECT_EQ(a.Listen("", 30500), 30500);
  EXPECT_EQ(a.endpoint().ToString(), "inmem:30500");
  EXPECT_THROW(b.Listen("127.0.0.1", 30500), Error);
  EXPECT_THROW(a.Listen("", 0), Error);  // twice
  const uint16_t picked = c.Listen("", 0);
  EXPECT_NE(picked, 0);
  EXPECT_NE(picked, 30500);
}

TEST(InMemoryTransportTest, SendWithoutConnectThrowsPeerError) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net);
  EXPECT_THROW(a.transport->Send(5, MakeMessage(Command::kHeartbeat, 0, 1)), PeerError);
}

// As over TCP, identity comes from the link: a message that claims another sender than the one
// the link belongs to breaks it (both ends see the peer lost) and is never delivered.
TEST(InMemoryTransportTest, AForgedSenderBreaksTheLinkAndIsNotDelivered) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net);
  a.ConnectTo(b);
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 0, 1));
  ASSERT_TRUE(b.inbox.WaitMessages(1));
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 5, 2));  // "I am node 5"
  ASSERT_TRUE(b.inbox.WaitLost(1));
  ASSERT_TRUE(a.inbox.WaitLost(1));
  a.transport->Shutdown(Deadline(kWait));
  b.transport->Shutdown(Deadline(kWait));
  EXPECT_EQ(b.inbox.messages().size(), 1u);
  EXPECT_EQ(b.inbox.lost()[0].peer, 0);  // the link's node, not the claimed one
  EXPECT_NE(b.inbox.lost()[0].reason.find("as node 5"), std::string::npos)
      << b.inbox.lost()[0].reason;
}

TEST(InMemoryTransportTest, CrashReportsTheLossOnceOnEachPeer) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net), c(2, net);
  // b talks to a both ways, c only receives from a, and b and c know each other.
  a.ConnectTo(b);
  b.ConnectTo(a);
  a.ConnectTo(c);
  b.ConnectTo(c);
  c.ConnectTo(b);
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 0, 1));
  ASSERT_TRUE(b.inbox.WaitMessages(1));

  net->Crash(a.port);
  ASSERT_TRUE(b.inbox.WaitLost(1));
  ASSERT_TRUE(c.inbox.WaitLost(1));
  // Sending to the dead node reports nothing new and does not throw.
  EXPECT_FALSE(b.transport->IsConnected(0));
  b.transport->Send(0, MakeMessage(Command::kHeartbeat, 1, 2));
  b.transport->Send(0, MakeMessage(Command::kHeartbeat, 1, 3));
  // The dead node neither sends nor delivers.
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 0, 4));
  b.transport->Send(2, MakeMessage(Command::kHeartbeat, 1, 5));
  ASSERT_TRUE(c.inbox.WaitMessages(1));
  // The survivors still talk; then every transport shuts down, joining its delivery thread, and
  // only then are the losses and messages counted: once each, nothing from or to the dead node.
  c.transport->Send(1, MakeMessage(Command::kHeartbeat, 2, 6));
  EXPECT_TRUE(b.inbox.WaitMessages(2));
  EXPECT_THROW(net->Crash(a.port), InvalidArgument);  // nothing listens there any more
  for (TestNode* node : {&a, &b, &c}) node->transport->Shutdown(Deadline(kWait));

  for (TestNode* node : {&b, &c}) {
    const auto lost = node->inbox.lost();
    ASSERT_EQ(lost.size(), 1u) << "node " << node->id;
    EXPECT_EQ(lost[0].peer, 0);
    EXPECT_EQ(lost[0].remote, "inmem:" + std::to_string(a.port));
    EXPECT_NE(lost[0].reason.find("crashed"), std::string::npos);
  }
  EXPECT_TRUE(a.inbox.lost().empty());
  EXPECT_EQ(b.inbox.messages().size(), 2u);  // the one before the crash and c's
  EXPECT_EQ(c.inbox.messages().size(), 1u);  // b's
  EXPECT_TRUE(a.inbox.messages().empty());
}

TEST(InMemoryTransportTest, OrderlyShutdownDrainsAndReportsNoLoss) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net);
  a.ConnectTo(b);
  b.ConnectTo(a);
  net->SetFilter([](NodeId from, NodeId, const Message& m) {
    return m.header.request_id % 50 == 0 ? FaultAction::Delay(Duration(20))
                                         : FaultAction::Deliver();
  });
  for (int i = 0; i < 300; ++i) a.transport->Send(1, MakeMessage(Command::kPush, 0, i, 0, {1}));
  a.transport->Shutdown(Deadline(kWait));  // returns once b has taken everything
  EXPECT_EQ(b.inbox.messages().size(), 300u);
  EXPECT_FALSE(a.transport->IsConnected(1));
  a.transport->Send(1, MakeMessage(Command::kPush, 0, 999));  // ignored after Shutdown
  a.transport->Shutdown(Deadline(kWait));                     // idempotent
  b.transport->Shutdown(Deadline(kWait));
  EXPECT_TRUE(a.inbox.lost().empty());
  EXPECT_TRUE(b.inbox.lost().empty());
}

TEST(InMemoryTransportTest, SimultaneousShutdownReportsNoLoss) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net), c(2, net);
  for (TestNode* x : {&a, &b, &c}) {
    for (TestNode* y : {&a, &b, &c}) {
      if (x != y) x->ConnectTo(*y);
    }
  }
  std::vector<std::thread> threads;
  for (TestNode* x : {&a, &b, &c}) {
    threads.emplace_back([x] { x->transport->Shutdown(Deadline(kWait)); });
  }
  for (auto& t : threads) t.join();
  for (TestNode* x : {&a, &b, &c}) EXPECT_TRUE(x->inbox.lost().empty());
}

TEST(InMemoryTransportTest, SendToAPeerThatShutDownReportsItLost) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net);
  a.ConnectTo(b);
  b.transport->Shutdown(Deadline(kWait));
  EXPECT_FALSE(a.transport->IsConnected(1));
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 0, 1));
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 0, 2));
  ASSERT_TRUE(a.inbox.WaitLost(1));
  std::this_thread::sleep_for(50ms);
  ASSERT_EQ(a.inbox.lost().size(), 1u);
  EXPECT_EQ(a.inbox.lost()[0].peer, 1);
  EXPECT_EQ(a.inbox.lost()[0].remote, "inmem:" + std::to_string(b.port));
}

TEST(InMemoryTransportTest, FilterDropsMessages) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net);
  a.ConnectTo(b);
  std::atomic<int> seen{0};
  net->SetFilter([&](NodeId from, NodeId to, const Message& m) {
    ++seen;
    EXPECT_EQ(from, 0);
    EXPECT_EQ(to, 1);
    return m.header.key == 13 ? FaultAction::Drop() : FaultAction::Deliver();
  });
  for (uint64_t key : {1, 13, 2, 13, 3})
    a.transport->Send(1, MakeMessage(Command::kPull, 0, key, key));
  ASSERT_TRUE(b.inbox.WaitMessages(3));
  net->SetFilter(nullptr);
  a.transport->Send(1, MakeMessage(Command::kPull, 0, 13, 13));
  ASSERT_TRUE(b.inbox.WaitMessages(4));
  const auto got = b.inbox.messages();
  std::vector<uint64_t> keys;
  for (const Message& m : got) keys.push_back(m.header.key);
  EXPECT_EQ(keys, (std::vector<uint64_t>{1, 2, 3, 13}));
  EXPECT_EQ(seen.load(), 5);
  EXPECT_EQ(net->dropped(), 2u);
  EXPECT_TRUE(a.inbox.lost().empty());  // a drop is silent
  EXPECT_TRUE(b.inbox.lost().empty());
}

TEST(InMemoryTransportTest, FilterDelaysMessagesInOrder) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net), c(2, net);
  a.ConnectTo(b);
  c.ConnectTo(b);
  net->SetFilter([](NodeId from, NodeId, const Message& m) {
    return from == 0 && m.header.request_id == 1 ? FaultAction::Delay(Duration(300))
                                                 : FaultAction::Deliver();
  });
  const auto start = Clock::now();
  a.transport->Send(1, MakeMessage(Command::kPull, 0, 1));
  a.transport->Send(1, MakeMessage(Command::kPull, 0, 2));  // waits behind the delayed one
  c.transport->Send(1, MakeMessage(Command::kPull, 2, 3));  // another link: not held up
  ASSERT_TRUE(b.inbox.WaitMessages(1));
  EXPECT_EQ(b.inbox.messages()[0].header.sender, 2);
  ASSERT_TRUE(b.inbox.WaitMessages(3));
  EXPECT_GE(Clock::now() - start, 300ms);
  const auto got = b.inbox.messages();
  EXPECT_EQ(got[1].header.request_id, 1u);
  EXPECT_EQ(got[2].header.request_id, 2u);
}

TEST(InMemoryTransportTest, FilterCutBreaksTheLinkForBothSides) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net), c(2, net);
  a.ConnectTo(b);
  b.ConnectTo(a);
  a.ConnectTo(c);
  net->SetFilter([](NodeId, NodeId, const Message& m) {
    return m.header.key == 99 ? FaultAction::Cut() : FaultAction::Deliver();
  });
  a.transport->Send(1, MakeMessage(Command::kPush, 0, 1, 1, {1}));
  a.transport->Send(1, MakeMessage(Command::kPush, 0, 2, 99, {1}));
  ASSERT_TRUE(a.inbox.WaitLost(1));
  ASSERT_TRUE(b.inbox.WaitLost(1));
  EXPECT_EQ(a.inbox.lost()[0].peer, 1);
  EXPECT_EQ(a.inbox.lost()[0].remote, "inmem:" + std::to_string(b.port));
  EXPECT_EQ(b.inbox.lost()[0].peer, 0);
  EXPECT_EQ(b.inbox.lost()[0].remote, "inmem:" + std::to_string(a.port));
  EXPECT_NE(a.inbox.lost()[0].reason.find("cut"), std::string::npos);
  EXPECT_FALSE(a.transport->IsConnected(1));
  EXPECT_FALSE(b.transport->IsConnected(0));
  b.transport->Send(0, MakeMessage(Command::kPush, 1, 3));  // already reported: nothing new
  // Only a and b are cut off from each other.
  EXPECT_TRUE(a.transport->IsConnected(2));
  a.transport->Send(2, MakeMessage(Command::kPush, 0, 4));
  ASSERT_TRUE(c.inbox.WaitMessages(1));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(a.inbox.lost().size(), 1u);
  EXPECT_EQ(b.inbox.lost().size(), 1u);
  EXPECT_TRUE(c.inbox.lost().empty());
  for (const Message& m : b.inbox.messages()) EXPECT_NE(m.header.key, 99u);
  // A new link after the cut works, and its loss would be reported again.
  a.ConnectTo(b);
  net->SetFilter(nullptr);
  const size_t before = b.inbox.messages().size();
  a.transport->Send(1, MakeMessage(Command::kPush, 0, 5));
  EXPECT_TRUE(b.inbox.WaitMessages(before + 1));
}

TEST(InMemoryTransportTest, HandlersMaySendFromInsideAHandler) {
  auto net = std::make_shared<InMemoryNetwork>();
  constexpr uint64_t kRounds = 2000;
  // A server answers every request from its handler; the client sends the next request from its
  // handler when the answer arrives: the whole exchange runs on delivery threads.
  std::atomic<uint64_t> answered{0};
  std::mutex mutex;
  std::condition_variable done;
  InMemoryTransport server(net), client(net);
  server.SetHandlers(
      [&](Message&& m) {
        Message reply = MakeMessage(Command::kPull, 1, m.header.request_id, m.header.key,
                                    {float(m.header.request_id)});
        reply.header.flags = kFlagResponse;
        server.Send(m.header.sender, std::move(reply));
      },
      nullptr);
  client.SetHandlers(
      [&](Message&& m) {
        EXPECT_EQ(BodyFloats(m), std::vector<float>{float(m.header.request_id)});
        if (++answered < kRounds) {
          client.Send(1, MakeMessage(Command::kPull, 0, m.header.request_id + 1));
        } else {
          std::lock_guard<std::mutex> lock(mutex);
          done.notify_all();
        }
      },
      nullptr);
  server.Listen("", 0);
  client.Listen("", 0);
  client.Connect(1, server.endpoint(), 0, Deadline(kWait));
  server.Connect(0, client.endpoint(), 1, Deadline(kWait));
  client.Send(1, MakeMessage(Command::kPull, 0, 0));
  std::unique_lock<std::mutex> lock(mutex);
  EXPECT_TRUE(done.wait_for(lock, kWait, [&] { return answered.load() >= kRounds; }));
  lock.unlock();
  client.Shutdown(Deadline(kWait));
  server.Shutdown(Deadline(kWait));
}

TEST(InMemoryTransportTest, CrashDuringTrafficDoesNotDeadlock) {
  for (int round = 0; round < 5; ++round) {
    auto net = std::make_shared<InMemoryNetwork>();
    Inbox client_inbox;
    std::atomic<uint64_t> replies{0};
    std::atomic<bool> stop{false};
    InMemoryTransport server(net), client(net);
    server.SetHandlers([&](Message&& m) { server.Send(0, MakeMessage(Command::kPull, 1, 0)); },
                       nullptr);
    client.SetHandlers(
        [&](Message&& m) {
          ++replies;
          client.Send(1, MakeMessage(Command::kPull, 0, 0, 0, {1, 2, 3}));
        },
        [&](NodeId p, const std::string& r, const std::string& why) {
          client_inbox.OnLost(p, r, why);
        });
    const uint16_t server_port = server.Listen("", 0);
    client.Listen("", 0);
    client.Connect(1, server.endpoint(), 0, Deadline(kWait));
    server.Connect(0, client.endpoint(), 1, Deadline(kWait));
    // Several request chains at once, with senders on other threads too.
    for (int i = 0; i < 4; ++i) client.Send(1, MakeMessage(Command::kPull, 0, 0));
    std::thread extra([&] {
      while (!stop) {
        client.Send(1, MakeMessage(Command::kPull, 0, 0));
        std::this_thread::sleep_for(100us);
      }
    });
    std::this_thread::sleep_for(Duration(20 + 10 * round));
    net->Crash(server_port);
    const bool lost = client_inbox.WaitLost(1);
    stop = true;
    extra.join();
    ASSERT_TRUE(lost);
    EXPECT_GT(replies.load(), 0u);
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(client_inbox.lost().size(), 1u);
    EXPECT_EQ(client_inbox.lost()[0].peer, 1);
    client.Shutdown(Deadline(kWait));
    server.Shutdown(Deadline(kWait));
  }
}

TEST(InMemoryTransportTest, MalformedMessageBreaksTheLink) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode a(0, net), b(1, net);
  a.ConnectTo(b);
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 0, 1, 0, {1.0f}));  // no body allowed
  ASSERT_TRUE(b.inbox.WaitLost(1));
  ASSERT_TRUE(a.inbox.WaitLost(1));
  EXPECT_NE(b.inbox.lost()[0].reason.find("malformed"), std::string::npos);
  EXPECT_NE(b.inbox.lost()[0].reason.find("carries a body"), std::string::npos);
  EXPECT_EQ(b.inbox.lost()[0].peer, 0);
  EXPECT_TRUE(b.inbox.messages().empty());
}

TEST(InMemoryTransportTest, WithoutWireValidationAnythingGoesThrough) {
  auto net = std::make_shared<InMemoryNetwork>();
  InMemoryOptions options;
  options.validate_wire = false;
  TestNode a(0, net, {}, options), b(1, net, {}, options);
  a.ConnectTo(b);
  a.transport->Send(1, MakeMessage(Command::kHeartbeat, 0, 1, 0, {1.0f}));
  ASSERT_TRUE(b.inbox.WaitMessages(1));
  EXPECT_EQ(BodyFloats(b.inbox.messages()[0]), std::vector<float>{1.0f});
}

TEST(InMemoryTransportTest, ReceiverAttributesTheLinkToTheLatestSenderId) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode scheduler(0, net);
  // A node that does not know its id yet connects with kNoNode, as to the scheduler.
  TestNode anonymous(kNoNode, net);
  TestNode named(kNoNode, net);
  anonymous.ConnectTo(scheduler);
  named.ConnectTo(scheduler);
  named.transport->Send(0, MakeMessage(Command::kRegister, kNoNode, 1));
  named.transport->Send(0, MakeMessage(Command::kReady, 9, 2));            // learned its id: 9
  named.transport->Send(0, MakeMessage(Command::kHeartbeat, kNoNode, 3));  // keeps 9
  ASSERT_TRUE(scheduler.inbox.WaitMessages(3));
  net->Crash(named.port);
  net->Crash(anonymous.port);
  ASSERT_TRUE(scheduler.inbox.WaitLost(2));
  std::vector<NodeId> peers;
  for (const Lost& l : scheduler.inbox.lost()) peers.push_back(l.peer);
  EXPECT_EQ(peers, (std::vector<NodeId>{9, kNoNode}));
}

TEST(InMemoryTransportTest, ShutdownFromInsideAHandler) {
  auto net = std::make_shared<InMemoryNetwork>();
  TestNode scheduler(0, net);
  Inbox inbox;
  InMemoryTransport worker(net);
  std::atomic<bool> stopped{false};
  worker.SetHandlers(
      [&](Message&& m) {
        if (m.header.command == Command::kTerminate) {
          worker.Send(0, MakeMessage(Command::kFinish, 1, 2));
          worker.Shutdown(Deadline(kWait));
          stopped = true;
        }
      },
      [&](NodeId p, const std::string& r, const std::string& why) { inbox.OnLost(p, r, why); });
  worker.Listen("", 0);
  worker.Connect(0, scheduler.transport->endpoint(), 1, Deadline(kWait));
  worker.Connect(1, worker.endpoint(), 1, Deadline(kWait));  // a link to itself, too
  scheduler.transport->Connect(1, worker.endpoint(), 0, Deadline(kWait));
  scheduler.transport->Send(1, MakeMessage(Command::kTerminate, 0, 1));
  ASSERT_TRUE(scheduler.inbox.WaitMessages(1));
  EXPECT_EQ(scheduler.inbox.messages()[0].header.command, Command::kFinish);
  for (int i = 0; i < 1000 && !stopped; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(stopped.load());
  worker.Shutdown(Deadline(kWait));  // from another thread: joins
  EXPECT_TRUE(inbox.lost().empty());
  EXPECT_TRUE(scheduler.inbox.lost().empty());
}

TEST(InMemoryTransportTest, DestructorShutsDown) {
  auto net = std::make_shared<InMemoryNetwork>();
  Inbox inbox;
  {
    TestNode a(0, net);
    auto b = std::make_unique<InMemoryTransport>(net);
    b->SetHandlers([&](Message&& m) { inbox.OnMessage(std::move(m)); }, nullptr);
    b->Listen("", 0);
    b->Connect(0, a.transport->endpoint(), 1, Deadline(kWait));
    for (int i = 0; i < 100; ++i) b->Send(0, MakeMessage(Command::kHeartbeat, 1, i));
    b.reset();  // drains, says Bye, joins
    EXPECT_EQ(a.inbox.messages().size(), 100u);
    EXPECT_TRUE(a.inbox.lost().empty());
  }
  // Everything is gone; the network alone is left.
  EXPECT_EQ(net.use_count(), 1);
}

}  // namespace
}  // namespace dtrain::transport

// Message priority over real TCP on loopback: while a connection is backed up, a value request (or
// a server's reply to one) of higher priority overtakes the ones waiting, but never one for its own
// key, and other messages keep their place.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp/tcp_transport.h"

namespace dtrain::transport {
namespace {

TcpOptions Options() {
  TcpOptions o;
  o.streams_per_peer = 1;  // one line to wait in
  o.same_host_direct = false;
  return o;
}

// Holds its first message until released, so that what follows backs up in the sender; then
// records the order in which messages arrive (their meta).
struct Receiver {
  Receiver() : transport(Options()) {
    transport.SetHandlers(
        [this](Message&& msg) {
          std::unique_lock<std::mutex> lock(mutex);
          if (arrived.empty()) released.wait(lock, [this] { return release; });
          arrived.push_back(msg.meta);
          changed.notify_all();
        },
        [](NodeId, const std::string&, const std::string&) {});
    port = transport.Listen("127.0.0.1", 0);
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
    released.notify_all();
  }
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(30), [&] { return arrived.size() >= n; });
  }
  size_t PositionOf(const std::string& meta) {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < arrived.size(); ++i) {
      if (arrived[i] == meta) return i;
    }
    return arrived.size();
  }

  TcpTransport transport;
  uint16_t port = 0;
  std::mutex mutex;
  std::condition_variable released, changed;
  bool release = false;
  std::vector<std::string> arrived;
};

// A value request, or with `reply` a server's answer to one.
Message Value(bool reply, Command command, uint64_t key, int priority, const std::string& meta,
              const std::vector<char>& payload = {}) {
  Message m;
  m.header.command = command;
  m.header.flags = reply ? kFlagResponse : 0;
  m.header.sender = 9;
  m.header.recipient = 1;
  m.header.key = key;
  m.meta = meta;
  m.header.priority = static_cast<int16_t>(priority);
  m.body.data = const_cast<char*>(payload.data());
  m.body.size = payload.size();
  return m;
}

// Backs a connection up with 48 MB of value messages (requests, or replies with `replies`) of
// priority -1, then sends an urgent one, an urgent one for the last filler's key, a message of
// another kind (`other`: a command, or a reply to one) and an urgent value after it, and checks
// the order they arrive in.
void ExpectUrgentOvertakesOnlyItsKind(bool replies, const Message& other) {
  Receiver receiver;
  TcpTransport sender(Options());
  sender.SetHandlers([](Message&&) {}, [](NodeId, const std::string&, const std::string&) {});
  sender.Connect(1, {"127.0.0.1", receiver.port}, 9, Deadline(Duration(10000)));
  const std::vector<char> megabyte(1 << 20, 'x');
  // The first message stops the receiver; 48 MB behind it fill the kernel's buffers and back up.
  sender.Send(1, Value(replies, Command::kPush, 1000, 0, "first"));
  constexpr int kFillers = 48;
  for (int i = 0; i < kFillers; ++i) {
    sender.Send(
        1, Value(replies, Command::kPush, 100 + i, -1, "filler " + std::to_string(i), megabyte));
  }
  sender.Send(1, Value(replies, Command::kPush, 5, 10, "urgent"));
  sender.Send(1, Value(replies, Command::kPull, 100 + kFillers - 1, 10, "urgent, same key"));
  Message copy = other;
  sender.Send(1, std::move(copy));
  sender.Send(1, Value(replies, Command::kPushPull, 6, 10, "after the other"));
  receiver.Release();
  ASSERT_TRUE(receiver.WaitFor(kFillers + 5)) << receiver.arrived.size() << " arrived";

  const size_t last_filler = receiver.PositionOf("filler " + std::to_string(kFillers - 1));
  EXPECT_LT(receiver.PositionOf("urgent"), last_filler / 2)
      << "the urgent message waited behind most of the others";
  EXPECT_EQ(receiver.PositionOf("urgent, same key"), last_filler + 1);
  EXPECT_GT(receiver.PositionOf(other.meta), last_filler);
  EXPECT_GT(receiver.PositionOf("after the other"), receiver.PositionOf(other.meta));
  for (int i = 1; i < kFillers; ++i) {  // equal priorities keep their order
    EXPECT_LT(receiver.PositionOf("filler " + std::to_string(i - 1)),
              receiver.PositionOf("filler " + std::to_string(i)));
  }
  sender.Shutdown(Deadline(Duration(5000)));
  receiver.transport.Shutdown(Deadline(Duration(5000)));
}

TEST(TcpPriority, AnUrgentRequestOvertakesWaitingOnesButNotItsOwnKeyNorOtherMessages) {
  Message command = Value(false, Command::kCommand, 7, 10, "a command");
  ExpectUrgentOvertakesOnlyItsKind(/*replies=*/false, command);
}

// A server's answers: the reply takes its request's priority (server.cc), so the values a worker
// needs first overtake the others waiting for it.
TEST(TcpPriority, AnUrgentReplyOvertakesWaitingRepliesButNotItsOwnKeyNorOtherReplies) {
  Message command_reply = Value(true, Command::kCommand, 7, 10, "a command's reply");
  ExpectUrgentOvertakesOnlyItsKind(/*replies=*/true, command_reply);
}

}  // namespace
}  // namespace dtrain::transport

// PS_RESEND over real TCP on loopback: connections are reset by the kernel (`ss -K`, as a
// middlebox or a flapping link would) while messages flow; with resend every message arrives
// exactly once and in order, without it the peer is reported lost.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/tcp/tcp_transport.h"

namespace dtrain::transport {
namespace {

TcpOptions Options(bool resend) {
  TcpOptions o;
  o.io_threads = 2;
  o.streams_per_peer = 2;
  o.same_host_direct = false;
  o.resend = resend;
  o.resend_timeout = Duration(200);
  o.resend_window = Duration(10000);
  return o;
}

// Records what arrives: each message's number (its meta) per key, and lost peers.
struct Receiver {
  explicit Receiver(bool resend) : transport(Options(resend)) {
    transport.SetHandlers(
        [this](Message&& msg) {
          std::lock_guard<std::mutex> lock(mutex);
          by_key[msg.header.key].push_back(std::stoll(msg.meta));
          ++count;
          changed.notify_all();
        },
        [this](NodeId peer, const std::string&, const std::string& why) {
          std::lock_guard<std::mutex> lock(mutex);
          lost.push_back(std::to_string(peer) + ": " + why);
          changed.notify_all();
        });
    port = transport.Listen("127.0.0.1", 0);
  }

  template <typename Predicate>
  bool WaitFor(Predicate done, int seconds) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(seconds), done);
  }

  TcpTransport transport;
  uint16_t port = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, std::vector<int64_t>> by_key;
  size_t count = 0;
  std::vector<std::string> lost;
};

// Resets every established connection of this process matching `filter` (ss's syntax); false
// where that is not possible here (not root, no ss, a kernel without socket destruction).
bool ResetConnections(const std::string& filter) {
  const std::string command = "ss -K state established " + filter + " >/dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

bool CanResetConnections() {
  return ::geteuid() == 0 && std::system("command -v ss >/dev/null 2>&1") == 0;
}

Message Numbered(int64_t i, size_t body_bytes, const std::vector<char>& payload) {
  Message m;
  m.header.command = Command::kPush;
  m.header.sender = 9;
  m.header.recipient = 1;
  m.header.key = static_cast<uint64_t>(i % 7);
  m.meta = std::to_string(i);
  m.body.data = const_cast<char*>(payload.data());
  m.body.size = body_bytes;
  return m;
}

// Sends `total` numbered messages from node 9 to `receiver` while `reset` runs, then checks what
// arrived.
struct Sender {
  Sender(Receiver& receiver, bool resend, int64_t total) : sender(Options(resend)), total(total) {
    sender.SetHandlers([](Message&&) {},
                       [this](NodeId peer, const std::string&, const std::string& why) {
                         sender_lost = std::to_string(peer) + ": " + why;
                       });
    sender.Connect(1, {"127.0.0.1", receiver.port}, 9, Deadline(Duration(10000)));
  }

  void SendAll() {
    for (int64_t i = 0; i < total; ++i) {
      sender.Send(1, Numbered(i, i % 3 == 0 ? payload.size() : 64, payload));
      sent = i + 1;
      if (i % 256 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::vector<char> payload = std::vector<char>(16 * 1024, 'x');  // resent from here
  TcpTransport sender;
  const int64_t total;
  std::atomic<int64_t> sent{0};
  std::string sender_lost;
};

TEST(TcpResend, ResetConnectionsAreResumedAndEveryMessageArrivesOnceInOrder) {
  if (!CanResetConnections()) GTEST_SKIP() << "needs root and ss to reset connections";
  Receiver receiver(/*resend=*/true);
  constexpr int64_t kTotal = 40000;
  Sender run(receiver, /*resend=*/true, kTotal);
  std::thread sending([&] { run.SendAll(); });
  // Resets from both ends, each while messages flow: the sender's sockets, then the receiver's.
  const std::string to_receiver = "dport = :" + std::to_string(receiver.port);
  const std::string from_receiver = "sport = :" + std::to_string(receiver.port);
  int resets = 0;
  for (const std::string& filter : {to_receiver, from_receiver, to_receiver}) {
    while (run.sent < kTotal / 4 * (resets + 1)) std::this_thread::sleep_for(Duration(1));
    ASSERT_TRUE(ResetConnections(filter)) << "ss -K failed";
    ++resets;
  }
  sending.join();
  ASSERT_TRUE(receiver.WaitFor([&] { return receiver.count >= kTotal; }, 30))
      << "only " << receiver.count << " of " << kTotal << " messages arrived";
  // Exactly once is counted after both ends shut down: the sender's Shutdown has written
  // everything (with its goodbye) and the receiver's has joined the threads that deliver.
  run.sender.Shutdown(Deadline(Duration(10000)));
  receiver.transport.Shutdown(Deadline(Duration(10000)));
  std::lock_guard<std::mutex> lock(receiver.mutex);
  EXPECT_EQ(receiver.count, static_cast<size_t>(kTotal)) << "some message arrived twice";
  EXPECT_TRUE(receiver.lost.empty()) << receiver.lost.front();
  EXPECT_TRUE(run.sender_lost.empty()) << run.sender_lost;
  for (const auto& [key, numbers] : receiver.by_key) {
    for (size_t j = 0; j < numbers.size(); ++j) {
      ASSERT_EQ(numbers[j], static_cast<int64_t>(key + 7 * j))
          << "key " << key << ": message " << j << " out of order, missing or repeated";
    }
  }
}

TEST(TcpResend, WithoutResendAResetLosesThePeer) {
  if (!CanResetConnections()) GTEST_SKIP() << "needs root and ss to reset connections";
  Receiver receiver(/*resend=*/false);
  Sender run(receiver, /*resend=*/false, 100);
  run.SendAll();
  ASSERT_TRUE(receiver.WaitFor([&] { return receiver.count >= 100; }, 10));
  ASSERT_TRUE(ResetConnections("dport = :" + std::to_string(receiver.port)));
  EXPECT_TRUE(receiver.WaitFor([&] { return !receiver.lost.empty(); }, 10))
      << "the reset went unnoticed";
  std::lock_guard<std::mutex> lock(receiver.mutex);
  EXPECT_NE(receiver.lost.front().find("9: "), std::string::npos) << receiver.lost.front();
}

}  // namespace
}  // namespace dtrain::transport

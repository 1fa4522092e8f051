// The watchdog over a real two-rank gloo context in one process (loopback TCP, HashStore).
#include "collectives/gloo/gloo_watchdog.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace dtrain::collectives {
namespace {

// Two connected gloo contexts, rank 0 and rank 1.
struct TwoRanks {
  TwoRanks() {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    device = gloo::transport::tcp::CreateDevice(attr);
    std::thread other([&] { context[1] = Connect(1); });
    context[0] = Connect(0);
    other.join();
  }

  std::shared_ptr<gloo::Context> Connect(int rank) {
    auto c = std::make_shared<gloo::rendezvous::Context>(rank, 2);
    c->setTimeout(std::chrono::seconds(30));
    c->connectFullMesh(store, device);
    return c;
  }

  gloo::rendezvous::HashStore store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::Context> context[2];
};

TEST(GlooWatchdog, AbortsAWaitForARankThatLeftAndTellsTheListener) {
  TwoRanks ranks;
  int value = 0;
  auto buffer = ranks.context[0]->createUnboundBuffer(&value, sizeof(value));
  buffer->recv(1, /*slot=*/7);  // rank 1 never sends: without the watchdog, a 30 s wait
  std::atomic<bool> gone{false};
  std::string told;
  GlooWatchdog watchdog([&] { return gone ? std::string("rank 1 (test) left the job") : ""; },
                        [&](const std::string& what) { told = what; });
  std::thread leave([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    gone = true;
  });
  const auto start = std::chrono::steady_clock::now();
  bool completed = true;
  {
    GlooWatchdog::Call call(&watchdog, {buffer.get()});
    completed = buffer->waitRecv(nullptr, std::chrono::seconds(30));
    EXPECT_EQ(watchdog.found(), "rank 1 (test) left the job");
  }
  leave.join();
  EXPECT_FALSE(completed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(told, "rank 1 (test) left the job");
}

TEST(GlooWatchdog, LeavesAHealthySlowCallAlone) {
  TwoRanks ranks;
  int received = 0;
  int sent = 42;
  auto in = ranks.context[0]->createUnboundBuffer(&received, sizeof(received));
  auto out = ranks.context[1]->createUnboundBuffer(&sent, sizeof(sent));
  in->recv(1, 3);
  std::atomic<int> asked{0};
  GlooWatchdog watchdog(
      [&] {
        ++asked;
        return std::string();
      },
      [](const std::string&) { ADD_FAILURE() << "nobody left"; });
  std::thread sender([&] {
    // Slower than the watchdog's quiet period, so that it asks at least once.
    std::this_thread::sleep_for(GlooWatchdog::kQuietPeriod + GlooWatchdog::kAskEvery);
    out->send(0, 3);
    out->waitSend(std::chrono::seconds(30));
  });
  {
    GlooWatchdog::Call call(&watchdog, {in.get()});
    EXPECT_TRUE(in->waitRecv(nullptr, std::chrono::seconds(30)));
  }
  sender.join();
  EXPECT_EQ(received, 42);
  EXPECT_GE(asked.load(), 1);
  EXPECT_EQ(watchdog.found(), "");
}

TEST(GlooWatchdog, ACallWithoutAWatchdogKeepsGloosOwnTimeout) {
  // Without a watchdog (a backend that has none), a wait for a rank that never answers is not
  // aborted (an abort returns false) but ends with gloo's own timeout error.
  TwoRanks ranks;
  int value = 0;
  auto buffer = ranks.context[0]->createUnboundBuffer(&value, sizeof(value));
  buffer->recv(1, /*slot=*/9);
  GlooWatchdog::Call call(nullptr, {buffer.get()});
  const auto wait = GlooWatchdog::kQuietPeriod + 2 * GlooWatchdog::kAskEvery;
  bool threw = false;
  try {
    (void)buffer->waitRecv(nullptr, std::chrono::duration_cast<std::chrono::milliseconds>(wait));
  } catch (const gloo::IoException&) {
    threw = true;
  }
  EXPECT_TRUE(threw);
}

}  // namespace
}  // namespace dtrain::collectives

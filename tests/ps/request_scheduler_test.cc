// RequestScheduler: one slot's requests in order, the most urgent slot first, cheap requests on
// the caller's thread when their slot is idle, fences, the bound on queued bodies, a throwing
// handler, no threads at all.
#include "ps/request_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::ps {
namespace {

using transport::Message;

constexpr Duration kLong{30000};

Message Request(uint64_t key, int16_t priority, size_t body_bytes = 0) {
  Message msg;
  msg.header.command = transport::Command::kPush;
  msg.header.key = key;
  msg.header.priority = priority;
  if (body_bytes > 0) {
    auto bytes = std::shared_ptr<char[]>(new char[body_bytes]);
    msg.body.data = bytes.get();
    msg.body.size = body_bytes;
    msg.body.owner = std::move(bytes);
  }
  return msg;
}

// Records which keys started, in order, and on which thread; key kGate then waits until Open().
class Recorder {
 public:
  static constexpr uint64_t kGate = 999;

  RequestScheduler::Handler Handler() {
    return [this](Message&& msg) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        keys_.push_back(msg.header.key);
        threads_.push_back(std::this_thread::get_id());
      }
      if (msg.header.key == kGate) opened_.wait();
    };
  }
  void Open() { gate_.set_value(); }
  std::vector<uint64_t> keys() {
    std::lock_guard<std::mutex> lock(mutex_);
    return keys_;
  }
  std::thread::id thread_of(size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_.at(i);
  }

 private:
  std::promise<void> gate_;
  std::shared_future<void> opened_ = gate_.get_future().share();
  std::mutex mutex_;
  std::vector<uint64_t> keys_;
  std::vector<std::thread::id> threads_;
};

TEST(RequestScheduler, RunsTheMostUrgentSlotFirstAndEqualOnesInArrivalOrder) {
  Recorder recorder;
  RequestScheduler scheduler(1, size_t{1} << 30, kLong, recorder.Handler());
  scheduler.Submit(Request(Recorder::kGate, 0), false);  // holds the one thread
  while (recorder.keys().empty()) std::this_thread::yield();
  scheduler.Submit(Request(1, -5), false);
  scheduler.Submit(Request(2, 0), false);
  scheduler.Submit(Request(3, -1), false);
  scheduler.Submit(Request(4, -1), false);
  scheduler.Submit(Request(5, 3), false);
  recorder.Open();
  ASSERT_TRUE(scheduler.Fence(kLong));
  EXPECT_EQ(recorder.keys(), (std::vector<uint64_t>{Recorder::kGate, 5, 2, 3, 4, 1}));
}

TEST(RequestScheduler, KeepsOneSlotsOrderWhateverItsPriorities) {
  std::vector<uint64_t> ids;
  std::mutex mutex;
  RequestScheduler scheduler(4, size_t{1} << 30, kLong, [&](Message&& msg) {
    std::lock_guard<std::mutex> lock(mutex);
    ids.push_back(msg.header.request_id);
  });
  for (int i = 0; i < 200; ++i) {
    Message msg = Request(7, static_cast<int16_t>(i % 7 - 3));  // priorities up and down
    msg.header.request_id = static_cast<uint64_t>(i);
    scheduler.Submit(std::move(msg), i % 2 == 0);  // cheap or not, the slot's order holds
  }
  ASSERT_TRUE(scheduler.Fence(kLong));
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(ids.size(), 200u);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], i);
}

TEST(RequestScheduler, RunsACheapRequestHereOnlyWhenItsSlotIsIdle) {
  Recorder recorder;
  RequestScheduler scheduler(1, size_t{1} << 30, kLong, recorder.Handler());
  scheduler.Submit(Request(1, 0), true);  // idle slot: runs before Submit returns, here
  ASSERT_EQ(recorder.keys(), (std::vector<uint64_t>{1}));
  EXPECT_EQ(recorder.thread_of(0), std::this_thread::get_id());
  EXPECT_EQ(scheduler.outstanding(), 0u);

  scheduler.Submit(Request(Recorder::kGate, 0), false);  // busy now
  while (recorder.keys().size() < 2) std::this_thread::yield();
  scheduler.Submit(Request(Recorder::kGate, 0), true);  // same slot: waits behind it
  EXPECT_EQ(scheduler.outstanding(), 2u);
  scheduler.Submit(Request(2, 0), true);  // another, idle slot: runs here at once
  EXPECT_EQ(recorder.keys(), (std::vector<uint64_t>{1, Recorder::kGate, 2}));
  recorder.Open();
  ASSERT_TRUE(scheduler.Fence(kLong));
  EXPECT_EQ(recorder.keys(), (std::vector<uint64_t>{1, Recorder::kGate, 2, Recorder::kGate}));
  EXPECT_NE(recorder.thread_of(3), std::this_thread::get_id());
}

// Cheap requests of one slot from several threads (several senders) still run one at a time,
// whether inline or queued behind one another.
TEST(RequestScheduler, RunsOneSlotsRequestsOneAtATimeFromSeveralThreads) {
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> ran{0};
  RequestScheduler scheduler(2, size_t{1} << 30, kLong, [&](Message&&) {
    if (++running > 1) ++overlaps;
    std::this_thread::yield();
    --running;
    ++ran;
  });
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) scheduler.Submit(Request(5, 0), (i + t) % 3 != 0);
    });
  }
  for (auto& sender : senders) sender.join();
  ASSERT_TRUE(scheduler.Fence(kLong));
  EXPECT_EQ(ran.load(), 2000);
  EXPECT_EQ(overlaps.load(), 0);
}

// A request that leads to a fence (a reply that finds its worker lost ends in OnWorkerLost) does
// not wait for itself, inline or on a scheduler thread.
TEST(RequestScheduler, AFenceInsideARequestReturnsAtOnce) {
  RequestScheduler* self = nullptr;
  std::vector<bool> fenced;
  std::mutex mutex;
  RequestScheduler scheduler(1, size_t{1} << 30, kLong, [&](Message&&) {
    const bool passed = self->Fence(kLong);
    std::lock_guard<std::mutex> lock(mutex);
    fenced.push_back(passed);
  });
  self = &scheduler;
  scheduler.Submit(Request(1, 0), true);   // inline
  scheduler.Submit(Request(2, 0), false);  // on the scheduler's thread
  ASSERT_TRUE(scheduler.Fence(kLong));
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(fenced, (std::vector<bool>{true, true}));
}

TEST(RequestScheduler, AFenceWaitsForWhatCameBeforeIt) {
  Recorder recorder;
  RequestScheduler scheduler(2, size_t{1} << 30, kLong, recorder.Handler());
  scheduler.Submit(Request(Recorder::kGate, 0), false);
  scheduler.Submit(Request(1, 0), false);
  EXPECT_FALSE(scheduler.Fence(Duration(20)));  // the gate has not run: gives up, says so
  auto fenced = std::async(std::launch::async, [&] { return scheduler.Fence(kLong); });
  recorder.Open();
  ASSERT_TRUE(fenced.get());
  const auto keys = recorder.keys();
  EXPECT_EQ(keys.size(), 2u);
  EXPECT_EQ(scheduler.outstanding(), 0u);
}

TEST(RequestScheduler, WaitsForRoomWhenQueuedBodiesPassTheBound) {
  Recorder recorder;
  RequestScheduler scheduler(1, 1000, kLong, recorder.Handler());
  scheduler.Submit(Request(Recorder::kGate, 0, 600), false);  // running, still counted
  while (recorder.keys().empty()) std::this_thread::yield();
  std::atomic<bool> started{false};
  std::atomic<bool> returned{false};
  std::thread sender([&] {
    started = true;
    scheduler.Submit(Request(1, 0, 600), false);  // 1200 > 1000: waits
    returned = true;
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());
  recorder.Open();
  sender.join();
  EXPECT_TRUE(returned.load());
  ASSERT_TRUE(scheduler.Fence(kLong));
  EXPECT_EQ(recorder.keys(), (std::vector<uint64_t>{Recorder::kGate, 1}));
}

TEST(RequestScheduler, QueuesAnywayWhenNoRoomComesInTime) {
  Recorder recorder;
  RequestScheduler scheduler(1, 1000, Duration(20), recorder.Handler());
  scheduler.Submit(Request(Recorder::kGate, 0, 600), false);
  scheduler.Submit(Request(1, 0, 600), false);  // returns after 20 ms, queued: nothing is lost
  EXPECT_EQ(scheduler.outstanding(), 2u);
  recorder.Open();
  ASSERT_TRUE(scheduler.Fence(kLong));
  EXPECT_EQ(recorder.keys(), (std::vector<uint64_t>{Recorder::kGate, 1}));
}

TEST(RequestScheduler, AThrowingRequestDoesNotStopItsSlot) {
  std::vector<uint64_t> ran;
  RequestScheduler scheduler(1, size_t{1} << 30, kLong, [&](Message&& msg) {
    if (msg.header.request_id == 0) throw std::runtime_error("bad request");
    ran.push_back(msg.header.request_id);
  });
  for (uint64_t id : {0, 1, 2}) {
    Message msg = Request(3, 0);
    msg.header.request_id = id;
    scheduler.Submit(std::move(msg), false);
  }
  ASSERT_TRUE(scheduler.Fence(kLong));
  EXPECT_EQ(ran, (std::vector<uint64_t>{1, 2}));
}

TEST(RequestScheduler, WithoutThreadsRunsEverythingHere) {
  Recorder recorder;
  RequestScheduler scheduler(0, size_t{1} << 30, kLong, recorder.Handler());
  scheduler.Submit(Request(1, 0, 1 << 20), false);
  scheduler.Submit(Request(2, 5), false);
  EXPECT_EQ(recorder.keys(), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(recorder.thread_of(1), std::this_thread::get_id());
  EXPECT_TRUE(scheduler.Fence(Duration(0)));
}

TEST(RequestScheduler, EndsWithoutRunningWhatHadNotStarted) {
  Recorder recorder;
  std::thread opener;
  {
    RequestScheduler scheduler(1, size_t{1} << 30, kLong, recorder.Handler());
    scheduler.Submit(Request(Recorder::kGate, 0), false);
    scheduler.Submit(Request(1, 0), false);
    scheduler.Submit(Request(2, 0), false);
    while (recorder.keys().empty()) std::this_thread::yield();  // the gate is running
    // Opens the gate once the destructor below is (almost surely) waiting for it.
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      recorder.Open();
    });
  }  // waits for the running request, drops keys 1 and 2
  opener.join();
  EXPECT_EQ(recorder.keys(), (std::vector<uint64_t>{Recorder::kGate}));
}

}  // namespace
}  // namespace dtrain::ps

#include "kvstore/serial_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

TEST(SerialQueue, RunsJobsInTheOrderPosted) {
  SerialQueue queue("test queue");
  std::vector<int> order;  // only the queue's thread writes it
  for (int i = 0; i < 100; ++i) queue.Post([&order, i] { order.push_back(i); });
  queue.Drain(std::chrono::seconds(10));
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_TRUE(queue.idle());
}

TEST(SerialQueue, AJobThatThrowsDoesNotStopTheNext) {
  SerialQueue queue("test queue");
  std::atomic<bool> ran{false};
  queue.Post([] { throw std::runtime_error("job failed"); });
  queue.Post([&ran] { ran = true; });
  queue.Drain(std::chrono::seconds(10));
  EXPECT_TRUE(ran);
}

TEST(SerialQueue, DrainIsBoundedAndNamesTheQueue) {
  SerialQueue queue("the stuck queue");
  std::promise<void> release;
  auto released = release.get_future().share();
  queue.Post([released] { released.wait(); });
  EXPECT_FALSE(queue.idle());
  try {
    queue.Drain(std::chrono::milliseconds(50));
    ADD_FAILURE() << "Drain returned while a job was running";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("the stuck queue"), std::string::npos) << e.what();
  }
  release.set_value();
  queue.Drain(std::chrono::seconds(10));
  EXPECT_TRUE(queue.idle());
}

TEST(SerialQueue, DestructionRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    SerialQueue queue("test queue");
    for (int i = 0; i < 10; ++i) queue.Post([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace dtrain

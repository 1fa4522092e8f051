#include "ps/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dtrain {
namespace {

TEST(ThreadPool, EveryIndexIsCoveredOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> seen(1000);
  pool.ParallelFor(1000, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) ++seen[i];
  });
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

// A piece that throws on a pool thread must not end the process: the caller gets the exception,
// after every other piece has ended, and the pool keeps working.
TEST(ThreadPool, AnExceptionInAnyPieceReachesTheCaller) {
  ThreadPool pool(4);
  for (int thrower = 0; thrower < 4; ++thrower) {
    std::atomic<int> finished{0};
    EXPECT_THROW(pool.ParallelFor(4,
                                  [&](int64_t begin, int64_t) {
                                    if (begin == thrower) throw std::runtime_error("piece failed");
                                    ++finished;
                                  }),
                 std::runtime_error);
    EXPECT_EQ(finished.load(), 3) << "thrower " << thrower;
  }
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(100, [&](int64_t begin, int64_t end) { sum += end - begin; });
  EXPECT_EQ(sum.load(), 100);
}

// A second caller does not wait for the first one's loop: it runs its own on its own thread, whole,
// and gets it right. (Were it to wait, this test would never end: the first loop waits for it.)
TEST(ThreadPool, ACallWhileThePoolIsBusyRunsOnItsCallersThread) {
  ThreadPool pool(4);
  std::promise<void> second_done;
  std::shared_future<void> second_finished = second_done.get_future().share();
  std::promise<void> first_started;
  std::thread first([&] {
    pool.ParallelFor(4, [&](int64_t begin, int64_t) {
      if (begin == 0) {
        first_started.set_value();
        second_finished.wait();
      }
    });
  });
  first_started.get_future().wait();
  std::vector<std::thread::id> threads;
  std::vector<int> seen(1000, 0);
  pool.ParallelFor(1000, [&](int64_t begin, int64_t end) {
    threads.push_back(std::this_thread::get_id());
    for (int64_t i = begin; i < end; ++i) ++seen[i];
  });
  second_done.set_value();
  first.join();
  EXPECT_EQ(threads, std::vector<std::thread::id>{std::this_thread::get_id()});
  for (int s : seen) EXPECT_EQ(s, 1);
}

}  // namespace
}  // namespace dtrain

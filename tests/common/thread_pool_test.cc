#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

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

}  // namespace
}  // namespace dtrain

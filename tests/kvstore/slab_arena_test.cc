// SlabArena: aligned, non-overlapping buffers carved from slabs; a slab whose buffers are gone is
// reused instead of mapping more (the push log's steady state maps nothing new); big buffers get
// slabs of their own; spares beyond the limit are unmapped; buffers may outlive the arena.
#include "kvstore/slab_arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

namespace dtrain {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(SlabArenaTest, BuffersAreAlignedAndDisjoint) {
  auto arena = SlabArena::Create(64 * kMiB);
  std::vector<std::shared_ptr<char>> buffers;
  for (size_t bytes : {1, 63, 64, 65, 1000, 4096, 100000}) {
    buffers.push_back(arena->Get(bytes));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffers.back().get()) % 64, 0u);
    std::memset(buffers.back().get(), static_cast<int>(bytes & 0xff), bytes);
  }
  size_t i = 0;
  for (size_t bytes : {1, 63, 64, 65, 1000, 4096, 100000}) {
    const char* p = buffers[i++].get();
    for (size_t j = 0; j < bytes; ++j) ASSERT_EQ(p[j], static_cast<char>(bytes & 0xff));
  }
  EXPECT_EQ(arena->mapped_bytes(), SlabArena::kSlabBytes);  // all from one slab
}

TEST(SlabArenaTest, AFirstInFirstOutLogMapsNothingNewOnceWarm) {
  // A log of 200 KB pushes, trimmed from its oldest end, as the push log is.
  auto arena = SlabArena::Create(64 * kMiB);
  std::deque<std::shared_ptr<char>> log;
  size_t warm = 0;
  for (int round = 0; round < 2000; ++round) {
    log.push_back(arena->Get(200000));
    if (log.size() > 100) log.pop_front();  // about 20 MB live
    if (round == 500) warm = arena->mapped_bytes();
  }
  EXPECT_GT(warm, 0u);
  EXPECT_EQ(arena->mapped_bytes(), warm);
  EXPECT_LE(warm, 40 * kMiB);  // the live 20 MB, whole slabs, and a spare or two
}

TEST(SlabArenaTest, BigBuffersGetSlabsOfTheirOwnAndAreReused) {
  auto arena = SlabArena::Create(64 * kMiB);
  char* first = nullptr;
  {
    auto big = arena->Get(5 * kMiB);
    first = big.get();
    std::memset(first, 7, 5 * kMiB);
    EXPECT_EQ(arena->mapped_bytes(), 6 * kMiB);  // whole huge pages
  }
  EXPECT_EQ(arena->spare_bytes(), 6 * kMiB);
  auto again = arena->Get(5 * kMiB);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(arena->spare_bytes(), 0u);
}

TEST(SlabArenaTest, SparesBeyondTheLimitAreUnmapped) {
  auto arena = SlabArena::Create(SlabArena::kSlabBytes);  // one spare slab at most
  {
    std::vector<std::shared_ptr<char>> held;
    for (int i = 0; i < 3; ++i) held.push_back(arena->Get(SlabArena::kSlabBytes));
    EXPECT_EQ(arena->mapped_bytes(), 3 * SlabArena::kSlabBytes);
  }
  EXPECT_EQ(arena->spare_bytes(), SlabArena::kSlabBytes);
  EXPECT_EQ(arena->mapped_bytes(), SlabArena::kSlabBytes);
}

TEST(SlabArenaTest, BuffersOutliveTheirArena) {
  auto arena = SlabArena::Create(64 * kMiB);
  auto small = arena->Get(100);
  auto big = arena->Get(4 * kMiB);
  arena.reset();
  std::memset(small.get(), 1, 100);
  std::memset(big.get(), 2, 4 * kMiB);
  small.reset();  // their slabs unmap themselves
  big.reset();
}

// Pages of [p, p + bytes) the kernel has in memory (mincore).
size_t ResidentPages(const char* p, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const size_t span = reinterpret_cast<uintptr_t>(p) + bytes - begin;
  std::vector<unsigned char> in((span + page - 1) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), span, in.data()), 0);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

TEST(SlabArenaTest, ReservedSlabsAreFaultedInAndServeTheFirstBuffers) {
  constexpr size_t kBuffer = 200 * 1024;
  const size_t pages = (kBuffer + static_cast<size_t>(::sysconf(_SC_PAGESIZE)) - 1) /
                       static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto fresh = SlabArena::Create(64 * kMiB);
  auto untouched = fresh->Get(kBuffer);
  EXPECT_LT(ResidentPages(untouched.get(), kBuffer), pages);  // a fresh mapping faults later

  auto arena = SlabArena::Create(64 * kMiB);
  EXPECT_EQ(arena->Reserve(20 * kMiB), 3 * SlabArena::kSlabBytes);  // whole slabs
  EXPECT_EQ(arena->mapped_bytes(), 3 * SlabArena::kSlabBytes);
  EXPECT_EQ(arena->Reserve(10 * kMiB), 3 * SlabArena::kSlabBytes);  // already there
  std::vector<std::shared_ptr<char>> buffers;
  for (int i = 0; i < 100; ++i) {  // 20 MB, from the reserve
    buffers.push_back(arena->Get(kBuffer));
    EXPECT_EQ(ResidentPages(buffers.back().get(), kBuffer), pages);
  }
  EXPECT_EQ(arena->mapped_bytes(), 3 * SlabArena::kSlabBytes);     // nothing new mapped
  EXPECT_EQ(SlabArena::Create(4 * kMiB)->Reserve(64 * kMiB), 0u);  // under a slab of limit
}

TEST(SlabArenaTest, ThreadsTakeAndReleaseConcurrently) {
  auto arena = SlabArena::Create(32 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&arena, t] {
      std::deque<std::shared_ptr<char>> mine;
      for (int i = 0; i < 5000; ++i) {
        const size_t bytes = 64 + static_cast<size_t>((i * 7919 + t) % 300000);
        mine.push_back(arena->Get(bytes));
        std::memset(mine.back().get(), t, bytes);
        if (mine.size() > 20) mine.pop_front();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(arena->mapped_bytes(), 32 * kMiB + 16 * SlabArena::kSlabBytes);
}

}  // namespace
}  // namespace dtrain

// BufferPool: returned buffers are reused, aligned, capped, and safe to outlive their pool; big
// ones are advised huge pages.
#include "common/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace dtrain {
namespace {

bool Aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(BufferPoolTest, ReturnedBuffersAreReused) {
  auto pool = BufferPool::Create();
  char* first = nullptr;
  {
    auto buffer = pool->Get(1000);
    first = buffer.get();
    std::memset(first, 1, 1000);
    EXPECT_EQ(pool->cached_bytes(), 0u);
  }
  EXPECT_EQ(pool->cached_bytes(), 1024u);  // rounded up to a power of two
  auto again = pool->Get(1000);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool->cached_bytes(), 0u);
}

TEST(BufferPoolTest, SizesOfOneClassShareBuffers) {
  auto pool = BufferPool::Create();
  char* p = pool->Get(513).get();  // class 1024: released at once
  EXPECT_EQ(pool->Get(1024).get(), p);
  char* big = pool->Get((size_t{1} << 20) + 1).get();  // big buffers round to 1 MiB steps
  EXPECT_EQ(pool->cached_bytes(), 1024u + (size_t{2} << 20));
  EXPECT_EQ(pool->Get(size_t{2} << 20).get(), big);
  // A different class does not take it.
  auto other = pool->Get(size_t{3} << 20);
  EXPECT_NE(other.get(), big);
}

TEST(BufferPoolTest, BuffersAre64ByteAligned) {
  auto pool = BufferPool::Create();
  std::vector<std::shared_ptr<char>> held;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000},
                       size_t{4097}, size_t{1} << 20, (size_t{1} << 20) + 3}) {
    held.push_back(pool->Get(bytes));
    EXPECT_NE(held.back(), nullptr) << bytes;
    EXPECT_TRUE(Aligned64(held.back().get())) << bytes;
    if (bytes > 0) std::memset(held.back().get(), 0xab, bytes);  // the whole size is usable
  }
  EXPECT_TRUE(Aligned64(BufferPool::Default().Get(10).get()));
}

// The VmFlags line of the mapping of this process that holds `p` (/proc/self/smaps); "" if none.
std::string MappingFlags(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= address && address < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// Blocks of 2 MiB or more are whole huge pages, aligned to one and advised to the kernel as such
// (VmFlags "hg"), so that copies through them run at one speed in every process.
TEST(BufferPoolTest, BigBuffersAreWholeAdvisedHugePages) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages to advise";
  }
  constexpr size_t kHuge = size_t{2} << 20;
  auto pool = BufferPool::Create();
  auto big = pool->Get(5 * (size_t{1} << 20));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.get()) % kHuge, 0u);
  EXPECT_NE(MappingFlags(big.get()).find(" hg"), std::string::npos) << MappingFlags(big.get());
  char* block = big.get();
  big.reset();
  EXPECT_EQ(pool->cached_bytes(), 3 * kHuge);  // 5 MiB rounds to three huge pages
  EXPECT_EQ(pool->Get(6 * (size_t{1} << 20)).get(), block);

  auto small = pool->Get(size_t{1} << 20);  // below a huge page: not advised
  EXPECT_EQ(MappingFlags(small.get()).find(" hg"), std::string::npos) << MappingFlags(small.get());
}

TEST(BufferPoolTest, CacheLimitIsRespected) {
  auto pool = BufferPool::Create(/*cache_limit_bytes=*/256);
  {
    std::vector<std::shared_ptr<char>> held;
    for (int i = 0; i < 4; ++i) held.push_back(pool->Get(128));
  }
  EXPECT_EQ(pool->cached_bytes(), 256u);  // two of the four kept, two freed

  auto none = BufferPool::Create(/*cache_limit_bytes=*/0);
  none->Get(100).reset();
  EXPECT_EQ(none->cached_bytes(), 0u);

  auto small = BufferPool::Create(/*cache_limit_bytes=*/1000);
  small->Get(4000).reset();  // bigger than the whole cache
  EXPECT_EQ(small->cached_bytes(), 0u);
}

TEST(BufferPoolTest, BuffersMayOutliveTheirPool) {
  auto pool = BufferPool::Create();
  auto cached = pool->Get(300);
  auto kept = pool->Get(5000);
  cached.reset();  // in the pool's free list when the pool goes
  pool.reset();
  std::memset(kept.get(), 0x5a, 5000);  // still valid memory
  EXPECT_EQ(kept.get()[4999], 0x5a);
  kept.reset();  // freed, not returned to the dead pool (AddressSanitizer checks this)
}

TEST(BufferPoolTest, DefaultIsOnePool) {
  EXPECT_EQ(&BufferPool::Default(), &BufferPool::Default());
}

TEST(BufferPoolTest, ConcurrentUse) {
  auto pool = BufferPool::Create(size_t{1} << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      std::vector<std::shared_ptr<char>> held;
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = 64u << ((i + t) % 8);
        held.push_back(pool->Get(bytes));
        std::memset(held.back().get(), t, bytes);
        if (held.size() > 8) held.erase(held.begin());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(pool->cached_bytes(), size_t{1} << 20);
}

}  // namespace
}  // namespace dtrain

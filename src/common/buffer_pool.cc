#include "common/buffer_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace dtrain {
namespace {

constexpr size_t kAlign = 64;
// Blocks of at least one huge page are made of whole huge pages. Where the kernel backs them with
// huge pages (transparent_hugepage "madvise" or "always"), copying them runs at the same speed in
// every process: with 4 KiB pages a 16 MB memcpy took 0.64-0.82 ms depending on the process (on
// this project's VM), with huge pages 0.61-0.64 (docs/performance.md, issue 13).
constexpr size_t kHugePage = size_t{2} << 20;

// Round small requests to a power of two, big ones to 1 MiB and those of a huge page or more to
// whole huge pages, so that values of the same key reuse the same block round after round.
size_t CapacityFor(size_t bytes) {
  if (bytes > (size_t{1} << 50)) throw std::bad_alloc();  // also keeps the rounding from wrapping
  if (bytes <= kAlign) return kAlign;
  if (bytes >= kHugePage) return (bytes + kHugePage - 1) / kHugePage * kHugePage;
  constexpr size_t kBig = size_t{1} << 20;
  if (bytes >= kBig) return (bytes + kBig - 1) / kBig * kBig;
  size_t c = kAlign;
  while (c < bytes) c <<= 1;
  return c;
}

// Memory of `capacity` bytes; huge-page blocks aligned to a huge page and advised as such (advice
// the kernel may ignore: the block works either way).
char* Allocate(size_t capacity) {
  const bool huge = capacity >= kHugePage;
  auto* ptr = static_cast<char*>(std::aligned_alloc(huge ? kHugePage : kAlign, capacity));
  if (ptr == nullptr) throw std::bad_alloc();
  if (huge) ::madvise(ptr, capacity, MADV_HUGEPAGE);
  return ptr;
}

}  // namespace

std::shared_ptr<BufferPool> BufferPool::Create(size_t cache_limit_bytes) {
  return std::shared_ptr<BufferPool>(new BufferPool(cache_limit_bytes));
}

BufferPool::~BufferPool() {
  for (auto& [cap, ptr] : free_) std::free(ptr);
}

BufferPool& BufferPool::Default() {
  static std::shared_ptr<BufferPool> pool = Create();
  return *pool;
}

std::shared_ptr<char> BufferPool::Get(size_t bytes) {
  const size_t capacity = CapacityFor(bytes);
  char* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(capacity);
    if (it != free_.end()) {
      ptr = it->second;
      free_.erase(it);
      cached_ -= capacity;
    }
  }
  if (ptr == nullptr) ptr = Allocate(capacity);
  std::weak_ptr<BufferPool> owner = weak_from_this();
  return std::shared_ptr<char>(ptr, [owner, capacity](char* p) {
    if (auto pool = owner.lock()) {
      pool->Return(p, capacity);
    } else {
      std::free(p);
    }
  });
}

void BufferPool::Return(char* ptr, size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ + capacity <= cache_limit_) {
      free_.emplace(capacity, ptr);
      cached_ += capacity;
      return;
    }
  }
  std::free(ptr);
}

size_t BufferPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

}  // namespace dtrain

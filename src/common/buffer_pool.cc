#include "common/buffer_pool.h"

#include <cstdlib>
#include <new>

namespace dtrain {
namespace {

constexpr size_t kAlign = 64;

// Round small requests to a power of two and big ones to 1 MiB so that values of the same key
// reuse the same block round after round.
size_t CapacityFor(size_t bytes) {
  if (bytes > (size_t{1} << 50)) throw std::bad_alloc();  // also keeps the rounding from wrapping
  if (bytes <= kAlign) return kAlign;
  constexpr size_t kBig = size_t{1} << 20;
  if (bytes >= kBig) return (bytes + kBig - 1) / kBig * kBig;
  size_t c = kAlign;
  while (c < bytes) c <<= 1;
  return c;
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
  if (ptr == nullptr) {
    ptr = static_cast<char*>(std::aligned_alloc(kAlign, capacity));
    if (ptr == nullptr) throw std::bad_alloc();
  }
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

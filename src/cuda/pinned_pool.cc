#include "cuda/pinned_pool.h"

#include <bit>

#include "cuda/cuda_check.h"

namespace dtrain::cuda {

PinnedPool& PinnedPool::Default() {
  // Never destroyed: buffers held by arrays may come back during exit.
  static auto* pool = new PinnedPool();
  return *pool;
}

std::shared_ptr<char> PinnedPool::Get(size_t bytes) {
  const size_t capacity = std::bit_ceil(bytes < 4096 ? size_t{4096} : bytes);
  char* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(capacity);
    if (it != free_.end()) {
      block = it->second;
      free_.erase(it);
      cached_ -= capacity;
    }
  }
  if (!block) {
    void* p = nullptr;
    // Portable: usable from every device's streams, not only the current one's.
    Check(cudaHostAlloc(&p, capacity, cudaHostAllocPortable), "cudaHostAlloc (pinned staging)");
    block = static_cast<char*>(p);
  }
  return std::shared_ptr<char>(block, [this, capacity](char* p) { Return(p, capacity); });
}

void PinnedPool::Return(char* ptr, size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ + capacity <= kCacheLimit) {
      free_.emplace(capacity, ptr);
      cached_ += capacity;
      return;
    }
  }
  cudaFreeHost(ptr);
}

size_t PinnedPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

}  // namespace dtrain::cuda

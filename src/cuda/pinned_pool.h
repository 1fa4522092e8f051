// Page-locked host buffers, recycled.
//
// cudaHostAlloc costs milliseconds (the pages are pinned one by one), far more than copying a
// gradient, so buffers go back to a free list when their last reference drops and the next round
// of the same size reuses them. Sizes round up to a power of two so that keys of nearby sizes share
// buffers. Thread-safe; the pool lives for the whole process (buffers may be released from any
// thread, at any time, exit included).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace dtrain::cuda {

class PinnedPool {
 public:
  static PinnedPool& Default();

  // At least `bytes` of pinned host memory. Throws dtrain::Error if CUDA cannot allocate it.
  std::shared_ptr<char> Get(size_t bytes);
  size_t cached_bytes() const;

 private:
  PinnedPool() = default;
  void Return(char* ptr, size_t capacity);

  // Free buffers beyond this total are unpinned and freed.
  static constexpr size_t kCacheLimit = size_t{4} << 30;
  mutable std::mutex mutex_;
  std::multimap<size_t, char*> free_;  // capacity -> block
  size_t cached_ = 0;
};

}  // namespace dtrain::cuda

// Recycled, 64-byte aligned byte buffers.
//
// Receiving a 64 MB value into a freshly allocated buffer costs page faults on every round (ps-lite
// pays this and runs 64 MB at half its 16 MB rate). Buffers handed out here go back to a free list
// when their last reference drops, so steady-state rounds allocate nothing. Buffers of 2 MiB or
// more are whole transparent huge pages (madvise), which copy at one speed in every process.
// Thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace dtrain {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // cache_limit_bytes: free buffers beyond this total are returned to the system.
  static std::shared_ptr<BufferPool> Create(size_t cache_limit_bytes = size_t{1} << 30);
  ~BufferPool();

  // A buffer of at least `bytes` bytes (contents undefined). Never returns null.
  std::shared_ptr<char> Get(size_t bytes);

  size_t cached_bytes() const;

  // The process-wide pool used when no other is given.
  static BufferPool& Default();

 private:
  explicit BufferPool(size_t cache_limit_bytes) : cache_limit_(cache_limit_bytes) {}
  void Return(char* ptr, size_t capacity);

  const size_t cache_limit_;
  mutable std::mutex mutex_;
  std::multimap<size_t, char*> free_;  // capacity -> block
  size_t cached_ = 0;
};

}  // namespace dtrain

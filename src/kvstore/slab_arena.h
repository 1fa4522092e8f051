// SlabArena: buffers carved in order out of big mmap'd slabs, outside malloc's heap, for memory
// that lives long and goes roughly in the order it came: a worker's push log (ps/push_log.h)
// keeps every push until its server checkpoints, hundreds of MB.
//
// Why not malloc or BufferPool: kept in malloc's heap, those long-lived blocks sit between the
// short-lived tensors LibTorch allocates every step, the heap fragments, and malloc's own bin
// searches made a LeNet worker 14% slower (perf: _int_malloc and malloc_consolidate, 4x their
// samples without the log; docs/performance.md). Here a buffer costs a bump of a pointer and
// no allocation of its own: it shares its slab's reference count (an aliasing shared_ptr), and a
// slab whose buffers are all gone is kept for reuse, its pages already faulted in.
//
// Slabs are 8 MiB of transparent huge pages where the kernel allows; a request bigger than a
// quarter of that gets a slab of its own. Thread-safe; buffers may outlive their arena.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace dtrain {

class SlabArena : public std::enable_shared_from_this<SlabArena> {
 public:
  static constexpr size_t kSlabBytes = size_t{8} << 20;

  // spare_limit_bytes: empty slabs kept for reuse up to this total; beyond it they are unmapped.
  static std::shared_ptr<SlabArena> Create(size_t spare_limit_bytes);
  ~SlabArena();

  // A 64-byte aligned buffer of at least `bytes` bytes (contents undefined). Never null.
  std::shared_ptr<char> Get(size_t bytes);

  // Maps slabs for at least `bytes` (within the spare limit) and faults their pages in now, as
  // spares: the buffers first carved from them cost no page faults. A fresh page's fault and
  // zeroing is most of what filling the push log costs (on a VM, about 1.7 ms a MB), so a worker
  // pays it while it starts rather than in its first training steps. Best effort: stops
  // quietly where the kernel refuses a mapping. Returns the bytes now spare.
  size_t Reserve(size_t bytes);

  size_t spare_bytes() const;
  size_t mapped_bytes() const;

 private:
  struct Slab;
  explicit SlabArena(size_t spare_limit_bytes) : spare_limit_(spare_limit_bytes) {}
  std::shared_ptr<Slab> NewSlab(size_t capacity);  // under mutex_
  void Release(char* base, size_t capacity);       // a slab's last buffer went

  const size_t spare_limit_;
  mutable std::mutex mutex_;
  std::shared_ptr<Slab> current_;        // the slab small buffers are carved from
  std::multimap<size_t, char*> spares_;  // capacity -> empty slab
  size_t spare_bytes_ = 0;
  size_t mapped_bytes_ = 0;
};

}  // namespace dtrain

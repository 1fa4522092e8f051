#include "kvstore/slab_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <vector>

namespace dtrain {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `capacity` bytes (a multiple of kHugePage) aligned to a huge page, advised as huge pages.
char* Map(size_t capacity) {
  const size_t span = capacity + kHugePage;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  auto* start = static_cast<char*>(raw);
  char* base = reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(start), kHugePage));
  if (base != start) ::munmap(start, static_cast<size_t>(base - start));
  char* end = base + capacity;
  if (start + span != end) ::munmap(end, static_cast<size_t>(start + span - end));
  ::madvise(base, capacity, MADV_HUGEPAGE);  // advice: the slab works either way
  return base;
}

// Faults in every page of [base, base + bytes): one write per page (a huge page's first write
// faults in all of it).
void Touch(char* base, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t at = 0; at < bytes; at += page) {
    *static_cast<volatile char*>(base + at) = 0;
  }
}

}  // namespace

// A slab's buffers hold it through aliasing shared_ptrs; when the last goes, it goes back to the
// arena (or is unmapped, if the arena is gone).
struct SlabArena::Slab {
  Slab(std::weak_ptr<SlabArena> arena, char* base, size_t capacity)
      : arena(std::move(arena)), base(base), capacity(capacity) {}
  ~Slab() {
    if (auto owner = arena.lock()) {
      owner->Release(base, capacity);
    } else {
      ::munmap(base, capacity);
    }
  }
  std::weak_ptr<SlabArena> arena;
  char* const base;
  const size_t capacity;
  size_t used = 0;  // bytes carved so far (only the current slab is carved)
};

std::shared_ptr<SlabArena> SlabArena::Create(size_t spare_limit_bytes) {
  return std::shared_ptr<SlabArena>(new SlabArena(spare_limit_bytes));
}

SlabArena::~SlabArena() {
  // current_ may still be held by buffers; its Slab unmaps itself (its arena is gone by then).
  for (auto& [capacity, base] : spares_) ::munmap(base, capacity);
}

std::shared_ptr<SlabArena::Slab> SlabArena::NewSlab(size_t capacity) {
  char* base = nullptr;
  auto it = spares_.lower_bound(capacity);
  if (it != spares_.end() && it->first < 2 * capacity) {
    capacity = it->first;
    base = it->second;
    spares_.erase(it);
    spare_bytes_ -= capacity;
  } else {
    base = Map(capacity);
    mapped_bytes_ += capacity;
  }
  return std::make_shared<Slab>(weak_from_this(), base, capacity);
}

std::shared_ptr<char> SlabArena::Get(size_t bytes) {
  bytes = RoundUp(std::max<size_t>(bytes, 1), kAlign);
  // A full slab leaves after the lock: if no buffer holds it, it comes back through Release.
  std::shared_ptr<Slab> retired;
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > kSlabBytes / 4) {
    auto own = NewSlab(RoundUp(bytes, kHugePage));
    own->used = own->capacity;
    return std::shared_ptr<char>(own, own->base);
  }
  if (!current_ || current_->capacity - current_->used < bytes) {
    retired = std::move(current_);  // its buffers keep it; the last of them releases it
    current_ = NewSlab(kSlabBytes);
  }
  char* p = current_->base + current_->used;
  current_->used += bytes;
  return std::shared_ptr<char>(current_, p);
}

void SlabArena::Release(char* base, size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (spare_bytes_ + capacity <= spare_limit_) {
    spares_.emplace(capacity, base);
    spare_bytes_ += capacity;
    return;
  }
  ::munmap(base, capacity);
  mapped_bytes_ -= capacity;
}

size_t SlabArena::Reserve(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Whole slabs, as many as cover `bytes`, as many as the spare limit holds at most.
    bytes = std::min(RoundUp(bytes, kSlabBytes), spare_limit_ / kSlabBytes * kSlabBytes);
    if (spare_bytes_ >= bytes) return spare_bytes_;
    bytes -= spare_bytes_;
  }
  // Mapped and touched outside the lock: Get may be called meanwhile.
  std::vector<char*> mapped;
  for (size_t at = 0; at < bytes; at += kSlabBytes) {
    char* base = nullptr;
    try {
      base = Map(kSlabBytes);
    } catch (const std::bad_alloc&) {
      break;
    }
    Touch(base, kSlabBytes);
    mapped.push_back(base);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (char* base : mapped) {
    spares_.emplace(kSlabBytes, base);
    spare_bytes_ += kSlabBytes;
    mapped_bytes_ += kSlabBytes;
  }
  return spare_bytes_;
}

size_t SlabArena::spare_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spare_bytes_;
}

size_t SlabArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mapped_bytes_;
}

}  // namespace dtrain

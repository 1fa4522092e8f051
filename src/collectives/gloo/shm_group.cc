#include "collectives/gloo/shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <sstream>

#include "collectives/error_text.h"
#include "common/elementwise.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

constexpr uint64_t kMagic = 0x6474726e73686d31;  // "dtrnshm1"
constexpr uint32_t kVersion = 1;
constexpr size_t kLine = 64;
constexpr size_t kPage = 4096;
// All slots together stay under this, so that a container's small /dev/shm (Docker's default is
// 64 MiB) still holds the segment of many local ranks.
constexpr size_t kMaxDataBytes = size_t{48} << 20;
constexpr size_t kMinSlotBytes = size_t{64} << 10;
constexpr size_t kReasonBytes = 512;

// How a wait spends its time: a few polls for a peer that is about to arrive (both running), a few
// yields for one that waits for this core, then sleeps on the peer's futex, looking at its health
// between sleeps.
constexpr int kSpins = 100;
constexpr int kYields = 2;
constexpr auto kSleepSlice = std::chrono::milliseconds(50);
constexpr auto kHealthEvery = std::chrono::milliseconds(100);
// A wait asks the job who it lost (ShmGroupOptions::lost_ranks) this often, after as long.
constexpr auto kAskLostEvery = std::chrono::milliseconds(1000);

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// False once `pid` has exited (gone, or a zombie its parent has not reaped yet).
bool ProcessAlive(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // kill says it exists; no /proc to ask
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

std::string RandomName() {
  std::random_device rd;
  std::ostringstream name;
  name << "/dtrain-collectives-" << getpid() << "-" << std::hex << rd() << rd();
  return name.str();
}

std::string ErrnoText(int error) { return std::strerror(error); }

}  // namespace

struct alignas(kLine) RankControl {
  std::atomic<uint32_t> sequence;  // arrivals so far
  std::atomic<uint32_t> sleepers;  // ranks in a futex wait on `sequence`
  std::atomic<int32_t> pid;        // 0 until the rank attaches
};

struct alignas(kLine) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t size;
  uint64_t slot_bytes;
  uint64_t total_bytes;
  std::atomic<int32_t> abandoning;    // rank + 1 of the first rank to abandon; 0: none
  std::atomic<int32_t> abandoned_by;  // set to `abandoning` once `reason` is written
  char reason[kReasonBytes];          // that rank's error, NUL-terminated
};

struct ShmGroup::Layout {
  static size_t DataOffset(int size) {
    return RoundUp(sizeof(SegmentHeader) + sizeof(RankControl) * size, kPage);
  }
  static size_t TotalBytes(int size, size_t slot_bytes) {
    return DataOffset(size) + (size + 1) * slot_bytes;
  }
  SegmentHeader& header() { return *reinterpret_cast<SegmentHeader*>(this); }
  RankControl& control(int rank) {
    return reinterpret_cast<RankControl*>(reinterpret_cast<char*>(this) +
                                          sizeof(SegmentHeader))[rank];
  }
};

static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "futex words must be plain integers in shared memory");

std::unique_ptr<ShmGroup> ShmGroup::Create(const ShmGroupOptions& options) {
  size_t slot = options.slot_bytes;
  if (slot == 0) {
    slot = std::min(kDefaultSlotBytes, kMaxDataBytes / (options.size + 1));
    slot = std::max(kMinSlotBytes, slot / kMinSlotBytes * kMinSlotBytes);
  }
  slot = RoundUp(slot, kLine);
  const size_t total = Layout::TotalBytes(options.size, slot);
  const std::string name = RandomName();
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    throw Error("cannot create the shared memory segment " + name + ": " + ErrnoText(errno));
  // posix_fallocate, not ftruncate: a full /dev/shm fails here with ENOSPC instead of killing the
  // process with SIGBUS at its first write to the mapping.
  const int fallocate_error = posix_fallocate(fd, 0, static_cast<off_t>(total));
  void* base = fallocate_error == 0
                   ? mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  const int map_error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw Error("cannot make a shared memory segment of " + std::to_string(total >> 20) +
                " MiB in /dev/shm: " + ErrnoText(fallocate_error ? fallocate_error : map_error));
  }
  auto* header = new (base) SegmentHeader{};
  header->version = kVersion;
  header->size = static_cast<uint32_t>(options.size);
  header->slot_bytes = slot;
  header->total_bytes = total;
  auto* layout = static_cast<Layout*>(base);
  for (int r = 0; r < options.size; ++r) new (&layout->control(r)) RankControl{};
  layout->control(options.rank).pid.store(getpid());
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return std::unique_ptr<ShmGroup>(new ShmGroup(options, name, base, total));
}

std::unique_ptr<ShmGroup> ShmGroup::Attach(const std::string& name,
                                           const ShmGroupOptions& options) {
  if (options.rank <= 0 || options.rank >= options.size) {
    throw Error("rank " + std::to_string(options.rank) + " cannot attach to a group of " +
                std::to_string(options.size) + " (rank 0 creates it)");
  }
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0)
    throw Error("cannot open the shared memory segment " + name + ": " + ErrnoText(errno));
  struct stat st {};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(SegmentHeader))) {
    base = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (base == MAP_FAILED) throw Error("cannot map the shared memory segment " + name);
  auto fail = [&](const std::string& why) -> std::unique_ptr<ShmGroup> {
    munmap(base, st.st_size);
    throw Error("the shared memory segment " + name + " " + why);
  };
  auto* layout = static_cast<Layout*>(base);
  const SegmentHeader& header = layout->header();
  if (header.magic != kMagic || header.version != kVersion) return fail("is not dtrain's");
  if (header.slot_bytes < kLine || header.slot_bytes % kLine != 0 ||
      header.size != static_cast<uint32_t>(options.size) ||
      header.total_bytes != static_cast<uint64_t>(st.st_size) ||
      header.total_bytes != Layout::TotalBytes(options.size, header.slot_bytes)) {
    return fail("is laid out for " + std::to_string(header.size) + " ranks, not " +
                std::to_string(options.size));
  }
  int32_t nobody = 0;
  if (!layout->control(options.rank).pid.compare_exchange_strong(nobody, getpid())) {
    return fail("already has a rank " + std::to_string(options.rank) + " (process " +
                std::to_string(nobody) + ")");
  }
  ShmGroupOptions with_slot = options;
  with_slot.slot_bytes = header.slot_bytes;
  return std::unique_ptr<ShmGroup>(new ShmGroup(with_slot, name, base, st.st_size));
}

ShmGroup::ShmGroup(const ShmGroupOptions& options, std::string name, void* base, size_t bytes)
    : options_(options),
      name_(std::move(name)),
      base_(base),
      bytes_(bytes),
      slot_bytes_(static_cast<Layout*>(base)->header().slot_bytes),
      layout_(static_cast<Layout*>(base)) {}

ShmGroup::~ShmGroup() {
  Unlink();
  munmap(base_, bytes_);
}

void ShmGroup::Unlink() {
  if (unlinked_) return;
  shm_unlink(name_.c_str());
  unlinked_ = true;
}

char* ShmGroup::slot(int rank) const {
  return static_cast<char*>(base_) + Layout::DataOffset(options_.size) + rank * slot_bytes_;
}

char* ShmGroup::result() const { return slot(options_.size); }

void ShmGroup::Arrive() {
  RankControl& mine = layout_->control(options_.rank);
  ++arrivals_;
  // Both seq_cst, as the sleeper's increment of `sleepers` and its load of `sequence`: either it
  // sees the new number or this sees it sleeping.
  mine.sequence.store(arrivals_);
  if (mine.sleepers.load() > 0) Futex(&mine.sequence, FUTEX_WAKE, INT_MAX, nullptr);
}

void ShmGroup::WaitForAll(const Deadline& deadline, const char* what) {
  for (int r = 0; r < options_.size; ++r) {
    if (r != options_.rank) WaitFor(r, arrivals_, deadline, what);
  }
}

void ShmGroup::WaitFor(int rank, uint32_t target, const Deadline& deadline, const char* what) {
  RankControl& peer = layout_->control(rank);
  auto reached = [&] {
    return static_cast<int32_t>(peer.sequence.load(std::memory_order_acquire) - target) >= 0;
  };
  for (int i = 0; i < kSpins; ++i) {
    if (reached()) return;
    Pause();
  }
  for (int i = 0; i < kYields; ++i) {
    if (reached()) return;
    sched_yield();
  }
  auto next_check = Clock::now() + kHealthEvery;
  auto next_ask = Clock::now() + kAskLostEvery;
  while (true) {
    CheckAbandoned(what);
    const auto now = Clock::now();
    if (now >= next_check) {
      if (!ProcessAlive(peer.pid.load())) throw PeerError(Loss(rank));
      if (options_.lost_ranks && now >= next_ask) {
        if (std::string lost = options_.lost_ranks(); !lost.empty()) throw PeerError(lost);
        next_ask = Clock::now() + kAskLostEvery;
      }
      if (deadline.passed()) {
        throw TimeoutError("no progress within " + SecondsText(deadline.timeout()) +
                           " (DTRAIN_COLLECTIVE_TIMEOUT_MS) waiting for " + Describe(rank) +
                           " in a shared-memory " + what + "; a rank is stuck or far behind");
      }
      next_check = now + kHealthEvery;
    }
    peer.sleepers.fetch_add(1);
    const uint32_t seen = peer.sequence.load();
    if (static_cast<int32_t>(seen - target) < 0) {
      const timespec slice{0, std::chrono::nanoseconds(kSleepSlice).count()};
      Futex(&peer.sequence, FUTEX_WAIT, seen, &slice);
    }
    peer.sleepers.fetch_sub(1);
    if (reached()) return;
  }
}

std::string ShmGroup::Describe(int rank) const {
  return options_.describe_rank ? options_.describe_rank(rank) : "rank " + std::to_string(rank);
}

std::string ShmGroup::Loss(int rank) const {
  return options_.explain_loss ? options_.explain_loss(rank) : Describe(rank) + " left the job";
}

void ShmGroup::CheckAbandoned(const char* what) const {
  const int32_t by = layout_->header().abandoned_by.load(std::memory_order_acquire);
  if (by == 0) return;
  // A rank usually abandons because another one died: name the dead one, as its own wait would.
  for (int r = 0; r < options_.size; ++r) {
    if (r != options_.rank && !ProcessAlive(layout_->control(r).pid.load())) {
      throw PeerError(Loss(r));
    }
  }
  throw PeerError(Describe(by - 1) + " stopped the shared-memory " + what + " after an error (" +
                  layout_->header().reason + ")");
}

void ShmGroup::Abandon(const std::string& reason) {
  SegmentHeader& header = layout_->header();
  int32_t nobody = 0;
  if (header.abandoning.compare_exchange_strong(nobody, options_.rank + 1)) {
    const size_t n = std::min(reason.size(), sizeof(header.reason) - 1);
    std::memcpy(header.reason, reason.data(), n);
    header.reason[n] = '\0';
    header.abandoned_by.store(options_.rank + 1, std::memory_order_release);
  }
  for (int r = 0; r < options_.size; ++r) {
    Futex(&layout_->control(r).sequence, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void ShmGroup::Allreduce(const void* in, void* out, size_t count, DType dtype, Reduction how) {
  const AllreducePiece whole{in, out, count};
  AllreducePieces({&whole, 1}, dtype, how, 1.0);
}

namespace {

// Walks the pieces of a fused allreduce in order, as if they were one array.
class PieceWalk {
 public:
  PieceWalk(std::span<const AllreducePiece> pieces, size_t element)
      : pieces_(pieces), element_(element) {}

  // The next `bytes` of the pieces' inputs into `to`.
  void Gather(char* to, size_t bytes) {
    Visit(bytes, [&](const AllreducePiece& p, size_t at, size_t n) {
      std::memcpy(to, static_cast<const char*>(p.in) + at, n);
      to += n;
    });
  }
  // `from`'s `bytes` into the pieces' outputs, next in order.
  void Scatter(const char* from, size_t bytes) {
    Visit(bytes, [&](const AllreducePiece& p, size_t at, size_t n) {
      std::memcpy(static_cast<char*>(p.out) + at, from, n);
      from += n;
    });
  }
  void Skip(size_t bytes) {
    Visit(bytes, [](const AllreducePiece&, size_t, size_t) {});
  }
  // Calls visit(piece, byte offset in it, bytes) for the next `bytes`, piece by piece.
  template <typename Visitor>
  void Visit(size_t bytes, Visitor&& visit) {
    while (bytes > 0 && piece_ < pieces_.size()) {
      const AllreducePiece& p = pieces_[piece_];
      const size_t left = p.count * element_ - at_;
      if (left == 0) {
        ++piece_;
        at_ = 0;
        continue;
      }
      const size_t n = std::min(left, bytes);
      visit(p, at_, n);
      at_ += n;
      bytes -= n;
    }
  }

 private:
  std::span<const AllreducePiece> pieces_;
  const size_t element_;
  size_t piece_ = 0;
  size_t at_ = 0;  // bytes of pieces_[piece_] walked
};

// Sums a share in blocks this small, so that scaling it and copying it to the result slot read
// what the sum has just written from the cache, not from memory.
constexpr size_t kShareBlockBytes = 32 << 10;

}  // namespace

void ShmGroup::AllreducePieces(std::span<const AllreducePiece> pieces, DType dtype, Reduction how,
                               double scale) {
  const Deadline deadline(options_.timeout);
  const size_t element = DTypeSize(dtype);
  size_t count = 0;
  for (const AllreducePiece& p : pieces) count += p.count;
  if (options_.size == 1) {
    for (const AllreducePiece& p : pieces) {
      if (p.in != p.out && p.count > 0) std::memcpy(p.out, p.in, p.count * element);
      if (scale != 1.0) Scale(p.out, p.count, dtype, scale);
    }
    return;
  }
  // Each rank sums one share of a round. Its own input for that share is read where it is, the
  // sum goes straight into its own output (and the result slot, for the others), and only the
  // others' shares travel through the segment: per byte, one copy in and one copy out.
  PieceWalk gather(pieces, element), share(pieces, element), scatter(pieces, element);
  const size_t per_round = slot_bytes_ / element;
  const size_t align = std::max<size_t>(1, kLine / element);  // shares start on cache lines
  const int me = options_.rank;
  // A rank after the first two keeps an in-place block aside: the sum of ranks 0 and 1 goes
  // first into its output, which is then its input.
  if (me >= 2) own_block_.resize(kShareBlockBytes);
  for (size_t offset = 0; offset < count; offset += per_round) {
    const size_t n = std::min(per_round, count - offset);
    const size_t chunk = RoundUp((n + options_.size - 1) / options_.size, align);
    const size_t begin = std::min(n, chunk * me) * element;
    const size_t end = std::min(n, chunk * me + chunk) * element;
    const size_t bytes = n * element;
    gather.Gather(slot(me), begin);
    gather.Skip(end - begin);
    gather.Gather(slot(me) + end, bytes - end);
    Arrive();
    WaitForAll(deadline, "allreduce");
    size_t at = begin;  // in the round
    share.Skip(begin);
    share.Visit(end - begin, [&](const AllreducePiece& p, size_t piece_at, size_t len) {
      for (size_t b = 0; b < len; b += kShareBlockBytes) {
        const size_t m = std::min(kShareBlockBytes, len - b);
        const char* mine = static_cast<const char*>(p.in) + piece_at + b;
        char* out = static_cast<char*>(p.out) + piece_at + b;
        if (me >= 2 && p.in == p.out) {
          mine = static_cast<const char*>(std::memcpy(own_block_.data(), mine, m));
        }
        const auto from = [&](int r) { return r == me ? mine : slot(r) + at; };
        // In rank order, as every share is summed: every rank gets the same bits.
        Reduce(out, from(0), from(1), m / element, dtype, how);
        for (int r = 2; r < options_.size; ++r) Reduce(out, out, from(r), m / element, dtype, how);
        if (scale != 1.0) Scale(out, m / element, dtype, scale);
        std::memcpy(result() + at, out, m);
        at += m;
      }
    });
    share.Skip(bytes - end);
    Arrive();
    WaitForAll(deadline, "allreduce");
    scatter.Scatter(result(), begin);
    scatter.Skip(end - begin);
    scatter.Scatter(result() + end, bytes - end);
  }
}

void ShmGroup::Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  const Deadline deadline(options_.timeout);
  std::vector<size_t> offsets(bytes.size());
  size_t largest = 0;
  for (size_t r = 0, at = 0; r < bytes.size(); at += bytes[r], ++r) {
    offsets[r] = at;
    largest = std::max(largest, bytes[r]);
  }
  const size_t rounds = std::max<size_t>(1, (largest + slot_bytes_ - 1) / slot_bytes_);
  for (size_t round = 0; round < rounds; ++round) {
    const size_t from = round * slot_bytes_;
    auto piece = [&](int r) {
      return bytes[r] > from ? std::min(slot_bytes_, bytes[r] - from) : 0;
    };
    if (piece(options_.rank) > 0) {
      std::memcpy(slot(options_.rank), static_cast<const char*>(in) + from, piece(options_.rank));
    }
    Arrive();
    WaitForAll(deadline, "allgather");
    for (int r = 0; r < options_.size; ++r) {
      if (piece(r) > 0) std::memcpy(static_cast<char*>(out) + offsets[r] + from, slot(r), piece(r));
    }
    Arrive();
    WaitForAll(deadline, "allgather");
  }
}

void ShmGroup::Broadcast(void* data, size_t bytes, int root) {
  const Deadline deadline(options_.timeout);
  for (size_t from = 0; from < bytes; from += slot_bytes_) {
    const size_t n = std::min(slot_bytes_, bytes - from);
    char* at = static_cast<char*>(data) + from;
    if (options_.rank == root) std::memcpy(slot(root), at, n);
    Arrive();
    WaitForAll(deadline, "broadcast");
    if (options_.rank != root) std::memcpy(at, slot(root), n);
    Arrive();
    WaitForAll(deadline, "broadcast");
  }
}

void ShmGroup::Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                         const std::vector<size_t>& recv_bytes) {
  const Deadline deadline(options_.timeout);
  const int me = options_.rank;
  const int n = options_.size;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  std::vector<size_t> send_at(n), recv_at(n);
  uint64_t largest = 0;  // this rank's largest block to or from another rank
  size_t sent = 0, received = 0;
  for (int r = 0; r < n; sent += send_bytes[r], received += recv_bytes[r], ++r) {
    send_at[r] = sent;
    recv_at[r] = received;
    if (r != me) largest = std::max<uint64_t>(largest, std::max(send_bytes[r], recv_bytes[r]));
  }
  if (send_bytes[me] > 0) std::memcpy(dst + recv_at[me], src + send_at[me], send_bytes[me]);
  // The ranks agree on the number of rounds: every rank's largest block, through the slots.
  std::memcpy(slot(me), &largest, sizeof(largest));
  Arrive();
  WaitForAll(deadline, "alltoall");
  for (int r = 0; r < n; ++r) {
    uint64_t theirs = 0;
    std::memcpy(&theirs, slot(r), sizeof(theirs));
    largest = std::max(largest, theirs);
  }
  Arrive();
  WaitForAll(deadline, "alltoall");
  // Each round, a slot holds its rank's next piece for every rank, a cache-aligned share each
  // (unaligned only where a slot is too small for that).
  const size_t even = slot_bytes_ / n;
  const size_t share = even >= 64 ? even / 64 * 64 : std::max<size_t>(even, 1);
  const size_t rounds = (largest + share - 1) / share;
  auto piece = [share](size_t bytes, size_t from) {
    return bytes > from ? std::min(share, bytes - from) : 0;
  };
  for (size_t round = 0; round < rounds; ++round) {
    const size_t from = round * share;
    for (int r = 0; r < n; ++r) {
      const size_t p = r == me ? 0 : piece(send_bytes[r], from);
      if (p > 0) std::memcpy(slot(me) + r * share, src + send_at[r] + from, p);
    }
    Arrive();
    WaitForAll(deadline, "alltoall");
    for (int r = 0; r < n; ++r) {
      const size_t p = r == me ? 0 : piece(recv_bytes[r], from);
      if (p > 0) std::memcpy(dst + recv_at[r] + from, slot(r) + me * share, p);
    }
    Arrive();
    WaitForAll(deadline, "alltoall");
  }
}

void ShmGroup::Barrier() {
  const Deadline deadline(options_.timeout);
  Arrive();
  WaitForAll(deadline, "barrier");
}

}  // namespace dtrain::collectives

// ShmGroup: the collectives of ranks that share one host, through a shared memory segment instead
// of loopback TCP.
//
// Why: over loopback every gloo message is copied into the kernel and out again and handed to
// gloo's event-loop thread and back. On one host with few cores those wake-ups compete with the
// training itself (LeNet over gloo reached 0.73 of PyTorch DDP's throughput, where OpenMPI's
// shared memory matched the parameter server). Here each rank copies its data into its own slot of
// a segment every rank has mapped, announces that by bumping its sequence number (a futex other
// ranks may sleep on), and works on the others' slots directly.
//
// Segment: a header, one control block per rank (sequence number, sleepers, pid; a cache line
// each), one slot per rank and one result area. An operation is a series of rounds of at most a
// slot's bytes per rank. A round: fill own slot, arrive, wait for every rank; reduce (rank r sums
// the r-th share of every slot into the result area, in rank order, so every rank gets the same
// bits) or copy; arrive, wait for every rank; copy the result out. The second wait is what lets a
// rank overwrite its slot in the next round, and the first of the next round what lets it
// overwrite the result area. Ranks are therefore never more than one arrival apart.
//
// The segment is created by rank 0 with a random name, mode 0600, announced through the job's
// authenticated rendezvous store (under MPI: broadcast over MPI), and unlinked once every rank has
// mapped it: nothing stays in /dev/shm after the job, even when it is killed.
//
// Failures: a wait ends with PeerError when a rank's process is gone (its pid, recorded when it
// attached, no longer exists or is a zombie: pids are comparable because the group exists only
// among processes of one HostId, which includes the pid namespace) or when a rank abandoned the
// group after an error of its own; with TimeoutError once the operation has taken the collective
// timeout. Every rank must make the same calls in the same order with the same sizes (the engine
// arranges that). Used by one thread at a time per process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/allreduce_piece.h"
#include "common/elementwise.h"
#include "dtrain/common/deadline.h"
#include "dtrain/common/dtype.h"

namespace dtrain::collectives {

struct ShmGroupOptions {
  int rank = 0;
  int size = 1;
  Duration timeout{600000};  // of one operation
  // How errors name a rank: "rank 1 (host, address)".
  std::function<std::string(int rank)> describe_rank;
  // The text of the error when `rank`'s process is gone: "rank 1 (host, address) left the job".
  std::function<std::string(int rank)> explain_loss;
  // Who the job lost, whose process may still exist (frozen, stopped): "" when nobody. Asked about
  // once a second during a wait that lasts; a non-empty answer ends the wait with PeerError.
  std::function<std::string()> lost_ranks;
  // Slot bytes per rank; 0 picks the default (kDefaultSlotBytes, less for many ranks).
  size_t slot_bytes = 0;
};

class ShmGroup {
 public:
  static constexpr size_t kDefaultSlotBytes = size_t{4} << 20;

  // Rank 0: makes a new segment, which other ranks Attach by name(). Throws Error (naming the
  // reason: /dev/shm full or missing) if it cannot.
  static std::unique_ptr<ShmGroup> Create(const ShmGroupOptions& options);
  // Any other rank: maps the segment `name`. Throws Error if it cannot or if it does not match
  // (another group size, a rank already taken).
  static std::unique_ptr<ShmGroup> Attach(const std::string& name, const ShmGroupOptions& options);

  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  const std::string& name() const { return name_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Removes the name (the mappings stay): once every rank has attached, any rank may. Every rank
  // does when it lets the group go, so that a creator killed before it could (SIGKILL during
  // setup) leaves nothing in /dev/shm once the others end. Idempotent.
  void Unlink();

  // As Communicator's: out = in reduced over ranks by `how` (in == out allowed); every rank's
  // contribution concatenated in rank order; root's data to everyone; a barrier.
  void Allreduce(const void* in, void* out, size_t count, DType dtype,
                 Reduction how = Reduction::kSum);
  // The pieces' allreduce (allreduce_piece.h) as one array, each result times `scale`, with no
  // fusion buffer: each rank sums and scales one share, reading its own input there in place and
  // writing its output directly; the rest of its input is copied once into its slot and the rest
  // of its output once out of the result.
  void AllreducePieces(std::span<const AllreducePiece> pieces, DType dtype, Reduction how,
                       double scale);
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes);
  void Broadcast(void* data, size_t bytes, int root);
  void Barrier();
  // Each rank's block for rank r (send_bytes[r] bytes, blocks in rank order in `in`) to rank r,
  // which receives recv_bytes[s] bytes from rank s into `out` (blocks in rank order). A rank's own
  // block is copied straight across; every other byte is written to the segment once and read
  // from it once.
  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes);

  // After an error of this rank's: every rank waiting in the group, or arriving later, fails with a
  // PeerError naming this rank and `reason` (or a rank found dead) instead of waiting for it.
  void Abandon(const std::string& reason);

  struct Layout;

 private:
  ShmGroup(const ShmGroupOptions& options, std::string name, void* base, size_t bytes);

  void Arrive();
  // Waits until every other rank has arrived as often as this one.
  void WaitForAll(const Deadline& deadline, const char* what);
  void WaitFor(int rank, uint32_t target, const Deadline& deadline, const char* what);
  void CheckAbandoned(const char* what) const;
  std::string Describe(int rank) const;
  std::string Loss(int rank) const;  // the error's text once `rank`'s process is gone

  char* slot(int rank) const;
  char* result() const;

  ShmGroupOptions options_;
  std::string name_;
  void* base_;
  size_t bytes_;
  bool unlinked_ = false;
  size_t slot_bytes_ = 0;
  uint32_t arrivals_ = 0;  // this rank's arrivals so far (its sequence number)
  Layout* layout_;
  std::vector<char> own_block_;  // AllreducePieces: an in-place block of a rank after the second
};

}  // namespace dtrain::collectives

#include "collectives/mpi/mpi_ring.h"

#include <algorithm>
#include <stdexcept>

namespace dtrain::collectives {
namespace {

// The ring's plan. A unit is one segment of one step: unit u = step * segments + segment. Steps
// 0 .. N-2 reduce-scatter, N-1 .. 2N-3 allgather. Through unit u a rank receives a segment of
// block RecvBlock(step) from its left neighbour and sends one of block SendBlock(step) to its
// right; the block a step sends is the one the step before received, so unit u's send waits only
// for unit u - segments.
class RingPlan {
 public:
  RingPlan(int rank, int size, size_t count, size_t element, size_t segment_bytes)
      : rank_(rank), size_(size), count_(count) {
    block_ = (count + static_cast<size_t>(size) - 1) / static_cast<size_t>(size);
    segment_ = std::max<size_t>(1, segment_bytes / element);
    segments_ = std::max<size_t>(1, (block_ + segment_ - 1) / segment_);
    units_ = static_cast<size_t>(2 * (size - 1)) * segments_;
  }

  size_t units() const { return units_; }
  size_t segments() const { return segments_; }
  size_t segment_elements() const { return segment_; }  // of a full segment
  int Step(size_t unit) const { return static_cast<int>(unit / segments_); }
  bool Reduces(size_t unit) const { return Step(unit) < size_ - 1; }

  // Unit u's segment of the block it receives (or sends), as an element offset and count; a
  // block past the end of the data is empty.
  void RecvRange(size_t unit, size_t* offset, size_t* n) const {
    Range(RecvBlock(Step(unit)), unit % segments_, offset, n);
  }
  void SendRange(size_t unit, size_t* offset, size_t* n) const {
    Range(SendBlock(Step(unit)), unit % segments_, offset, n);
  }
  // The unit whose send read the region that allgather unit `unit` overwrites: the
  // reduce-scatter step that sent the same block (allgather step t receives the block that
  // reduce-scatter step t sent).
  size_t EarlierSendOfSameRegion(size_t unit) const {
    return static_cast<size_t>(Step(unit) - (size_ - 1)) * segments_ + unit % segments_;
  }

 private:
  int Wrap(int b) const { return ((b % size_) + size_) % size_; }
  int SendBlock(int step) const {
    return step < size_ - 1 ? Wrap(rank_ - step) : Wrap(rank_ + 1 - (step - (size_ - 1)));
  }
  int RecvBlock(int step) const {
    return step < size_ - 1 ? Wrap(rank_ - step - 1) : Wrap(rank_ - (step - (size_ - 1)));
  }
  void Range(int block, size_t segment, size_t* offset, size_t* n) const {
    const size_t block_begin = static_cast<size_t>(block) * block_;
    const size_t block_end = std::min(count_, block_begin + block_);
    const size_t begin = std::min(block_end, block_begin + segment * segment_);
    *offset = begin;
    *n = std::min(block_end, begin + segment_) - begin;
  }

  int rank_, size_;
  size_t count_, block_ = 0, segment_ = 0, segments_ = 0, units_ = 0;
};

}  // namespace

void MpiRingAllreduce(MPI_Comm comm, void* data, size_t count, DType dtype, Reduction how,
                      const MpiRingOptions& options, std::vector<char>* scratch,
                      const std::function<void(int code, const char* call)>& check) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size == 1 || count == 0) return;
  const size_t element = DTypeSize(dtype);
  const RingPlan plan(rank, size, count, element, options.segment_bytes);
  const auto window = static_cast<size_t>(std::max(1, options.window));
  const size_t segment_bytes = plan.segment_elements() * element;  // a scratch slot
  if (scratch->size() < window * segment_bytes) scratch->resize(window * segment_bytes);
  char* base = static_cast<char*>(data);
  const int left = (rank - 1 + size) % size, right = (rank + 1) % size;
  constexpr int kTag = 0x5249;  // "RI": this communicator carries nothing else meanwhile

  // Requests 0 .. window-1 receive unit u in slot u % window; window .. 2 window-1 send.
  std::vector<MPI_Request> requests(2 * window, MPI_REQUEST_NULL);
  std::vector<char> completed(2 * window, 0);
  std::vector<int> indices(2 * window);
  size_t posted = 0;     // receives posted: units 0 .. posted-1
  size_t received = 0;   // receives handled (reduced where they reduce), in order
  size_t sent = 0;       // sends started
  size_t delivered = 0;  // sends completed, counted in order

  auto post_receive = [&](size_t unit) {
    size_t offset = 0, n = 0;
    plan.RecvRange(unit, &offset, &n);
    void* into = plan.Reduces(unit) ? scratch->data() + (unit % window) * segment_bytes
                                    : base + offset * element;
    check(MPI_Irecv(into, static_cast<int>(n * element), MPI_BYTE, left, kTag, comm,
                    &requests[unit % window]),
          "MPI_Irecv");
  };
  auto start_send = [&](size_t unit) {
    size_t offset = 0, n = 0;
    plan.SendRange(unit, &offset, &n);
    check(MPI_Isend(base + offset * element, static_cast<int>(n * element), MPI_BYTE, right, kTag,
                    comm, &requests[window + unit % window]),
          "MPI_Isend");
  };
  // Starts every send and receive the windows and the data's readiness allow.
  auto start_what_can_go = [&] {
    while (sent < plan.units() && sent < delivered + window &&
           (sent < plan.segments() || sent - plan.segments() < received)) {
      start_send(sent++);
    }
    // An allgather receive overwrites a region an earlier send read: that send must be done.
    while (posted < plan.units() && posted < received + window &&
           (plan.Reduces(posted) || plan.EarlierSendOfSameRegion(posted) < delivered)) {
      post_receive(posted++);
    }
  };

  start_what_can_go();
  while (received < plan.units() || delivered < sent) {
    int done = 0;
    check(MPI_Waitsome(static_cast<int>(requests.size()), requests.data(), &done, indices.data(),
                       MPI_STATUSES_IGNORE),
          "MPI_Waitsome");
    if (done == MPI_UNDEFINED) throw std::logic_error("MPI ring allreduce: nothing in flight");
    for (int i = 0; i < done; ++i) completed[static_cast<size_t>(indices[i])] = 1;
    while (received < posted && completed[received % window]) {
      completed[received % window] = 0;
      if (plan.Reduces(received)) {
        size_t offset = 0, n = 0;
        plan.RecvRange(received, &offset, &n);
        char* into = base + offset * element;
        Reduce(into, into, scratch->data() + (received % window) * segment_bytes, n, dtype, how);
      }
      ++received;
    }
    while (delivered < sent && completed[window + delivered % window]) {
      completed[window + delivered % window] = 0;
      ++delivered;
    }
    start_what_can_go();
  }
}

}  // namespace dtrain::collectives

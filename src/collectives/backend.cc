#include "collectives/backend.h"

#include <cstring>

#include "collectives/adasum.h"
#include "common/elementwise.h"
#include "dtrain/common/error.h"
#include "report/timeline.h"

namespace dtrain::collectives {

void Communicator::Allreduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (size_ == 1 || count == 0) {
    // Nothing to exchange; MPI and Gloo would only copy.
    if (in != out && count > 0) std::memcpy(out, in, count * DTypeSize(dtype));
    return;
  }
  if (op == ReduceOp::kAdasum) return Adasum(in, out, {count}, dtype);
  // An average's scaling within the reduction where the backend can: each rank scales its share.
  const double scale = op == ReduceOp::kAverage ? 1.0 / size_ : 1.0;
  const AllreducePiece whole{in, out, count};
  if (DoAllreducePieces({&whole, 1}, dtype, ReductionOf(op), scale)) return;
  DoAllreduce(in, out, count, dtype, ReductionOf(op));
  if (scale != 1.0) Scale(out, count, dtype, scale);
}

void Communicator::AllreducePieces(std::span<const AllreducePiece> pieces, DType dtype, ReduceOp op,
                                   std::vector<char>& scratch) {
  if (op == ReduceOp::kAdasum) {
    throw InvalidArgument("AllreducePieces does not take Adasum: each tensor needs its own norms");
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  const size_t element = DTypeSize(dtype);
  size_t count = 0;
  for (const AllreducePiece& p : pieces) count += p.count;
  if (size_ == 1 || count == 0) {
    for (const AllreducePiece& p : pieces) {
      if (p.in != p.out && p.count > 0) std::memcpy(p.out, p.in, p.count * element);
    }
    return;
  }
  const double scale = op == ReduceOp::kAverage ? 1.0 / size_ : 1.0;
  if (DoAllreducePieces(pieces, dtype, ReductionOf(op), scale)) return;
  // Through a fusion buffer; the timeline shows its copies (report/timeline.h).
  if (scratch.size() < count * element) scratch.resize(count * element);
  auto copy_span = [&](int into) {
    return timeline::Span("fusion_copy", "collectives",
                          timeline::Enabled()
                              ? timeline::Args().Int("tensors", pieces.size()).Int("into", into)
                              : timeline::Args());
  };
  {
    auto span = copy_span(1);
    size_t at = 0;
    for (const AllreducePiece& p : pieces) {
      if (p.count > 0) std::memcpy(scratch.data() + at, p.in, p.count * element);
      at += p.count * element;
    }
  }
  DoAllreduce(scratch.data(), scratch.data(), count, dtype, ReductionOf(op));
  if (scale != 1.0) Scale(scratch.data(), count, dtype, scale);
  auto span = copy_span(0);
  size_t at = 0;
  for (const AllreducePiece& p : pieces) {
    if (p.count > 0) std::memcpy(p.out, scratch.data() + at, p.count * element);
    at += p.count * element;
  }
}

void Communicator::Adasum(const void* in, void* out, const std::vector<size_t>& counts,
                          DType dtype) {
  AdasumAllreduce(*this, in, out, counts, dtype, adasum_scratch_);
}

void Communicator::Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  if (bytes.size() != static_cast<size_t>(size_)) {
    throw InvalidArgument("allgatherv needs one size per rank: got " +
                          std::to_string(bytes.size()) + " for " + std::to_string(size_) +
                          " ranks");
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (size_ == 1) {
    if (in != out && bytes[0] > 0) std::memcpy(out, in, bytes[0]);
    return;
  }
  DoAllgatherv(in, out, bytes);
}

void Communicator::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    throw InvalidArgument("broadcast root " + std::to_string(root) + " is not a rank of a job of " +
                          std::to_string(size_));
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (size_ == 1 || bytes == 0) return;
  DoBroadcast(data, bytes, root);
}

void Communicator::Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                             const std::vector<size_t>& recv_bytes) {
  if (send_bytes.size() != static_cast<size_t>(size_) ||
      recv_bytes.size() != static_cast<size_t>(size_)) {
    throw InvalidArgument("alltoallv needs one send and one receive size per rank: got " +
                          std::to_string(send_bytes.size()) + " and " +
                          std::to_string(recv_bytes.size()) + " for " + std::to_string(size_) +
                          " ranks");
  }
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (size_ == 1) {
    if (send_bytes[0] != recv_bytes[0]) {
      throw InvalidArgument("alltoallv on one rank sends " + std::to_string(send_bytes[0]) +
                            " bytes to itself but receives " + std::to_string(recv_bytes[0]));
    }
    if (in != out && send_bytes[0] > 0) std::memcpy(out, in, send_bytes[0]);
    return;
  }
  DoAlltoallv(in, send_bytes, out, recv_bytes);
}

void Communicator::Barrier() {
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (size_ > 1) DoBarrier();
}

void Communicator::SetPeerLostListener(std::function<void(const std::string&)> listener) {
  std::lock_guard<std::mutex> lock(listener_mutex_);
  peer_lost_ = std::move(listener);
}

void Communicator::NotifyPeerLost(const std::string& what) {
  std::function<void(const std::string&)> listener;
  {
    std::lock_guard<std::mutex> lock(listener_mutex_);
    listener = peer_lost_;
  }
  if (listener) listener(what);
}

Reduction ReductionOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
    case ReduceOp::kAdasum:  // not elementwise (adasum.h); its identity, zeros, is a sum's
      return Reduction::kSum;
    case ReduceOp::kMin:
      return Reduction::kMin;
    case ReduceOp::kMax:
      return Reduction::kMax;
    case ReduceOp::kProduct:
      return Reduction::kProduct;
  }
  throw InvalidArgument("unknown reduction op " + std::to_string(static_cast<int>(op)));
}

std::unique_ptr<Communicator> CreateBackend(const CollectivesConfig& config) {
  return config.backend == BackendKind::kMpi ? CreateMpiBackend(config) : CreateGlooBackend(config);
}

}  // namespace dtrain::collectives

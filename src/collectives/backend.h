// Communicator: the backend (OpenMPI or Gloo) seen as plain synchronous collectives for one process
// of the job.
//
// Every rank must make the same calls in the same order with matching sizes; the Engine
// (engine.h) arranges that for named tensors submitted in any order. A Communicator is used by one
// thread at a time (the engine's background thread, or a benchmark's main thread).
//
// Failures are thrown: PeerError when another rank died or cut the connection (naming the rank
// when it is known, e.g. "rank 2 (127.0.0.1) left the job"), TimeoutError when a call ran past
// the collective timeout. After a failure the backend is broken: every later call throws the same
// error, as the ranks can no longer agree on what was exchanged.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/allreduce_piece.h"
#include "collectives/config.h"
#include "collectives/gloo/rendezvous_server.h"
#include "common/elementwise.h"
#include "dtrain/collectives/collectives.h"
#include "dtrain/common/dtype.h"

namespace dtrain::collectives {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual BackendKind kind() const = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // out = `in` reduced over ranks by `op` (sum, average, min, max, product, adasum), `count`
  // elements of `dtype`. `in == out` is in place. float32, float64, float16 and bfloat16 (Adasum:
  // not bfloat16, and a power-of-two number of ranks).
  void Allreduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op);
  // The fused allreduce of `pieces` (allreduce_piece.h), reduced by `op` (not Adasum) as one
  // array. Backends that reach the pieces where they lie do; the others get them through
  // `scratch` (grown as needed): copied in, reduced there, copied out.
  void AllreducePieces(std::span<const AllreducePiece> pieces, DType dtype, ReduceOp op,
                       std::vector<char>& scratch);
  // out = every rank's `in` concatenated in rank order; rank r contributes bytes[r] bytes.
  // `out` holds the sum of `bytes`.
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes);
  // Root's `data` into everyone's `data`.
  void Broadcast(void* data, size_t bytes, int root);
  // Personalised exchange: this rank sends send_bytes[r] bytes of `in` (blocks in rank order) to
  // rank r and receives recv_bytes[r] bytes from it into `out` (blocks in rank order). Each pair
  // of ranks must agree on the sizes between them.
  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes);
  void Barrier();

  // A communicator among `ranks` of this one (ascending, distinct, this rank among them) for a
  // process set: collective among those ranks only, which all pass the same `ranks` and
  // `generation` (a number no earlier subset of this job used: it keeps their rendezvous apart).
  // The new communicator's rank r is ranks[r]. Safe while another thread uses this one. Throws
  // PeerError/TimeoutError when the members cannot connect, ConfigError when the backend cannot
  // have subsets (an MPI without MPI_THREAD_MULTIPLE).
  virtual std::unique_ptr<Communicator> Subset(const std::vector<int>& ranks, int generation) = 0;

  // out = the Adasum (adasum.h) of every rank's `in`, tensors of `counts` elements end to end,
  // each combined with its own dot product and norms; `in == out` is in place. A power-of-two
  // size; float16/32/64.
  void Adasum(const void* in, void* out, const std::vector<size_t>& counts, DType dtype);

  // Whether a call that waits for a late rank sleeps (a futex in shared memory, gloo's blocking
  // reads) rather than polls (an MPI wait, which yields but keeps polling): the engine waits for
  // late ranks inside a round only where that costs no CPU.
  virtual bool WaitsSleep() const { return true; }

  // Calls made so far (each of the above counts one): lets tests see fusion work.
  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }

  // Called, from another thread, when the backend learns that a rank left the job while a call
  // may be stuck waiting for it (gloo's watchdog): the engine fails its handles at once instead of
  // when the call returns. Set before the calls start; `nullptr` removes it.
  void SetPeerLostListener(std::function<void(const std::string&)> listener);

 protected:
  // The reductions of `in` by `how` (sum, min, max, product); averages are sums scaled after.
  virtual void DoAllreduce(const void* in, void* out, size_t count, DType dtype, Reduction how) = 0;
  // The pieces reduced by `how`, each result times `scale` (1, or 1 / size for an average), where
  // they lie; false when this backend cannot (the caller then goes through a fusion buffer).
  virtual bool DoAllreducePieces(std::span<const AllreducePiece> /*pieces*/, DType /*dtype*/,
                                 Reduction /*how*/, double /*scale*/) {
    return false;
  }
  virtual void DoAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) = 0;
  virtual void DoBroadcast(void* data, size_t bytes, int root) = 0;
  virtual void DoAlltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                           const std::vector<size_t>& recv_bytes) = 0;
  virtual void DoBarrier() = 0;

  void NotifyPeerLost(const std::string& what);

  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;

 private:
  std::atomic<uint64_t> calls_{0};
  std::vector<char> adasum_scratch_;  // the partner's values, kept for the next Adasum
  std::mutex listener_mutex_;
  std::function<void(const std::string&)> peer_lost_;
};

// How `op` combines two ranks' values (an average is a sum, scaled after; Adasum is not
// elementwise and says kSum, whose identity it shares).
Reduction ReductionOf(ReduceOp op);

// Both throw ConfigError for a bad layout and PeerError/TimeoutError when the rendezvous fails.
std::unique_ptr<Communicator> CreateMpiBackend(const CollectivesConfig& config);
// `server`: rank 0's gloo rendezvous when it is open already (an elastic job's), else null.
std::unique_ptr<Communicator> CreateGlooBackend(const CollectivesConfig& config,
                                                std::unique_ptr<RendezvousServer> server = nullptr);
std::unique_ptr<Communicator> CreateBackend(const CollectivesConfig& config);

}  // namespace dtrain::collectives

// DeviceCommunicator: the data path of allreduce mode for collectives on CUDA arrays, over NCCL
// (Horovod's HOROVOD_GPU_OPERATIONS=NCCL).
//
// The engine (engine.h) still negotiates on the host backend (Gloo or MPI): which names every
// rank submitted, in which order they run, how they fuse. Only the tensors' bytes go over NCCL,
// on NCCL's own stream, which first waits (an event, no host synchronisation) for the work queued
// on each input's producer stream. The fusion buffer lives on the GPU.
//
// One communicator per job, made on the engine's thread by the first CUDA collective (every rank
// reaches it at the same point of the agreed order): rank 0's NCCL id travels over the host
// backend, and the ranks first compare their GPUs, because NCCL refuses two ranks on one GPU: that
// is an InvalidArgument naming the ranks, the host and the GPU, and suggesting host staging
// (HOROVOD_GPU_OPERATIONS=GLOO). With HOROVOD_HIERARCHICAL_ALLREDUCE (hierarchy.h) allreduces use
// a communicator per host and a group of the host backend across hosts instead; the communicator
// of every rank is then made by the first allgather or broadcast.
//
// Every call returns once NCCL's work has finished on the GPU (the handle is then done, as with
// the host backend). Waits are bounded by DTRAIN_COLLECTIVE_TIMEOUT_MS (TimeoutError) and end at
// once with PeerError when `abort` becomes true (the host backend learnt that a rank left); either
// way the NCCL communicator is aborted, so that no NCCL call is left waiting for a dead rank, and
// every later call throws the same error.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "collectives/backend.h"
#include "dtrain/common/array.h"
#include "dtrain/common/deadline.h"

namespace dtrain::collectives {

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;

  // outs[i] = ins[i] reduced over ranks by `op`. Several pairs are reduced as one
  // (through the fusion buffer); a single pair in its own memory (in place when in == out).
  virtual void Allreduce(const std::vector<Array>& ins, const std::vector<Array>& outs,
                         ReduceOp op) = 0;
  // Every rank's `in` concatenated in rank order into a new device array of `shape` (rank r
  // contributes bytes[r] bytes).
  virtual Array Allgatherv(const Array& in, const Shape& shape,
                           const std::vector<size_t>& bytes) = 0;
  // Root's `inout` into everyone's.
  virtual void Broadcast(const Array& inout, int root) = 0;
  // A new device array filled with the identity of `how` (FillIdentity: zeros for sums): what a
  // rank that has joined (run out of data) reduces.
  virtual Array Identity(const Shape& shape, DType dtype, Reduction how) = 0;
};

// NcclBuilt() is in collectives.h; it is defined beside the communicator.

// Collective over `host` (every rank calls it at the same point): makes this rank's NCCL
// communicator on `device`, hierarchical (hierarchy.h) when asked and every host holds as many
// ranks (else flat, with a warning). Throws InvalidArgument when NCCL is not built or two ranks
// that would share a communicator share a GPU, and TimeoutError/PeerError when NCCL's setup
// fails. `abort` must outlive the communicator; the communicator keeps `host`.
std::unique_ptr<DeviceCommunicator> CreateNcclCommunicator(std::shared_ptr<Communicator> host,
                                                           int device, Duration timeout,
                                                           const std::atomic<bool>& abort,
                                                           bool hierarchical);

}  // namespace dtrain::collectives

// A ring allreduce of dtrain's own over MPI point-to-point, for ranks on different hosts.
//
// Why not MPI_Allreduce there: on TCP links Open MPI's allreduce of a large buffer reaches about
// half of what the link carries (bench/cluster_bench.sh, docs/performance.md "Across emulated
// hosts"). Two causes were measured at 100 Mbit/s: with 2 hosts one large message each way at
// once goes no faster than the two one after the other (an 8 MB MPI_Sendrecv took 1.2 s, the same
// bytes as 32 messages of 256 KB all in flight 0.7 s: the link's rate); with 4 hosts its choice
// of algorithm sends every byte twice. Here each rank's block moves around the ring as segments
// of `segment_bytes`, a window of them in flight each way, and each segment goes on to the next
// rank as soon as it has been reduced, so a step's tail overlaps the next step's head.
//
// Reduce-scatter then allgather, 2 (N - 1) steps of a block each (the bytes a link must carry at
// the least). Segments from one neighbour arrive in the order sent (MPI keeps the order of
// messages of one source, tag and communicator), so they are handled in that order. Waits are
// MPI's: as with MPI_Allreduce, a rank that dies is reported by mpirun, and a broken connection
// is an MPI error the caller's `check` turns into a PeerError.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "common/elementwise.h"
#include "dtrain/common/dtype.h"

namespace dtrain::collectives {

// Segments go eagerly: under Open MPI's TCP eager limit (64 KiB with its header), a segment
// needs no handshake with its receiver. Larger ones do, and with both directions of a link busy
// that handshake waits behind the data: 256 KiB segments reached 0.60-0.64 of the link with 2
// hosts, 60 KiB ones 0.94-0.95 (1 and 16 MB at 100 Mbit/s and 1 Gbit/s, 2 and 4 hosts: 0.93-0.98;
// windows of 32, 64 and 128 alike).
struct MpiRingOptions {
  size_t segment_bytes = size_t{60} << 10;
  int window = 64;  // segments in flight each way (and scratch for as many received)
};

// `data` (`count` elements of `dtype`) becomes the reduction over the ranks of `comm` of every
// rank's `data`. `scratch` is grown to window * segment_bytes and kept for the next call. `check`
// receives each MPI return code with the call's name and throws on failure.
void MpiRingAllreduce(MPI_Comm comm, void* data, size_t count, DType dtype, Reduction how,
                      const MpiRingOptions& options, std::vector<char>* scratch,
                      const std::function<void(int code, const char* call)>& check);

}  // namespace dtrain::collectives

// Allreduce mode, in the manner of Horovod: workers sum gradients among themselves instead of
// sending them to parameter servers.
//
//   dtrain::collectives::Init();                       // backend and layout from the environment
//   auto h = dtrain::collectives::AllreduceAsync("grad.fc1", grad, grad, ReduceOp::kAverage);
//   ...                                                 // submit more; order may differ per rank
//   h.Wait();                                           // throws on a dead rank or at the deadline
//
// Two layers inside (docs/design.md, "Allreduce mode"):
//   - a backend: plain synchronous collectives, over OpenMPI or Gloo;
//   - an engine: a background thread, as Horovod's. Tensors are submitted by name; the ranks agree
//     which names every rank has submitted (so submission order may differ), fuse the small ready
//     ones into one buffer up to the fusion threshold, and run one backend call per buffer. A
//     collective that waits past the stall time logs a warning naming the missing ranks and
//     tensors.
// This header is the process-wide API over one engine; it has no LibTorch dependency (the training
// front end, dtrain/train/horovod.h, adapts torch tensors to Arrays).
//
// Environment (read by Init; see CollectivesConfig::FromEnvironment):
//   DTRAIN_COLLECTIVES       mpi | gloo. Default: mpi when started by mpirun (OMPI_COMM_WORLD_SIZE
//                            set), gloo otherwise.
//   gloo layout              rank DTRAIN_NODE_RANK, size DMLC_NUM_WORKER, rendezvous with rank 0
//                            at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT (what `dtrain launch -s 0`
//                            sets), or in the shared directory DTRAIN_GLOO_FILE_STORE.
//   mpi layout               from MPI itself (mpirun).
//   DTRAIN_GLOO_SHM=0        gloo between ranks of one host too; by default they exchange
//                            through shared memory, and hosts through one leader each.
//   DTRAIN_FUSION_THRESHOLD_MB (or Horovod's HOROVOD_FUSION_THRESHOLD in bytes): default 64 MB,
//                            0 disables fusion.
//   DTRAIN_CYCLE_TIME_MS (or HOROVOD_CYCLE_TIME): how long the engine gathers submissions before
//                            a negotiation round; default 1 ms.
//   DTRAIN_STALL_WARNING_S (or HOROVOD_STALL_CHECK_TIME_SECONDS): default 60.
//   DTRAIN_COLLECTIVE_TIMEOUT_MS: deadline of one collective and of Wait (default 600000).
//   DTRAIN_FP16_ALLREDUCE=1: float32 allreduces of host arrays are sent as float16 (compression).
//   HOROVOD_GPU_OPERATIONS   NCCL (default where built): CUDA arrays are reduced over NCCL; GLOO
//                            or MPI: front ends stage CUDA tensors through host memory.
//   HOROVOD_HIERARCHICAL_ALLREDUCE=1: NCCL allreduces reduce-scatter within each host, allreduce
//                            each shard across hosts in host memory over the backend, and
//                            allgather within each host (as many ranks on every host).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/common/array.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {

enum class BackendKind { kMpi, kGloo };
// Horovod's reductions. Average is the sum divided by the number of ranks. Adasum combines
// gradients by adaptive summation (Horovod's op=Adasum: two ranks' gradients a and b of a tensor
// give (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, pairs of ranks as a binary tree): float16/32/64
// in host memory, a power-of-two number of ranks.
enum class ReduceOp : uint8_t { kSum, kAverage, kMin, kMax, kProduct, kAdasum };

// A submitted collective. Copies share state. Wait() rethrows the collective's error
// (dtrain::PeerError naming the rank that died, TimeoutError at the deadline).
class Handle {
 public:
  Handle() = default;
  bool done() const;
  void Wait() const;
  // Runs `callback` once the collective has finished, with its error (null on success): at once
  // on this thread if it already has, else on the engine's thread, which it must not block for
  // long nor throw from. One callback per handle. A collective that never finishes never calls
  // it: callers keep their own deadline.
  void OnDone(std::function<void(std::exception_ptr)> callback) const;
  // For allgather, alltoall and reducescatter: the array this rank received (allgather: first
  // dimension = the sum of every rank's); valid after Wait.
  Array result() const;
  // For alltoall: how many rows came from each rank, in rank order; valid after Wait.
  std::vector<int64_t> received_rows() const;

  struct State;
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

// Starts the backend and the engine once per process; later calls are no-ops. Throws ConfigError
// for a bad environment and PeerError/TimeoutError when the rendezvous fails.
//
// In an elastic job (DTRAIN_ELASTIC=1, set by `dtrain launch --host-discovery-script`), every
// Init after a Shutdown joins the job's next membership: the launcher gives this worker its rank
// and the size (Horovod's reset). Throws RemovedFromJob when the launcher says this worker leaves.
void Init();
// Stops the engine (waits for what is in flight) and the backend. Called at exit if not before.
void Shutdown();
bool IsInitialized();

// An elastic job no longer has a place for this worker (its host left the discovery script's
// output): the process should end, with exit code 0.
class RemovedFromJob : public Error {
 public:
  using Error::Error;
};

BackendKind Backend();
int Rank();
int Size();
int LocalRank();  // rank among the processes on this host
int LocalSize();
// Built with NCCL (found beside the CUDA toolkit or in PyTorch's nvidia packages).
bool NcclBuilt();
// The NCCL version compiled against, as NCCL_VERSION_CODE (22803 for 2.28.3); 0 without NCCL.
int NcclVersion();
// Whether collectives on CUDA arrays run over NCCL on the GPU (HOROVOD_GPU_OPERATIONS=NCCL, the
// default where NCCL is built; one GPU per rank). When not, the collectives below take host
// arrays only and front ends copy CUDA tensors to host memory first (Horovod's host staging).
bool NcclEnabled();

// Horovod's process sets: subsets of the job's ranks whose collectives run among themselves,
// concurrently with other sets' (each set has an engine and a gloo or MPI communicator of its
// own). Set 0 (kGlobalProcessSet) is the whole job. Every collective below takes a set: ranks and
// roots are then counted within the set (its members in ascending order), and names are the
// set's own. Adding and removing sets are collectives of the whole job: every rank calls them in
// the same order with the same arguments, or all of them get an InvalidArgument. A CUDA array in a
// set is refused (no NCCL there): front ends stage it through host memory.
constexpr int kGlobalProcessSet = 0;
// The new set's id (the smallest free one from 1). `ranks`: ranks of the job, in any order.
int AddProcessSet(const std::vector<int>& ranks);
// Whether the set existed; its members stop its engine. Set 0 is never removed.
bool RemoveProcessSet(int process_set);
// The set's members as ranks of the job, ascending; InvalidArgument for an unknown set.
std::vector<int> ProcessSetRanks(int process_set);
// Every set's id, 0 first.
std::vector<int> ProcessSetIds();

// Asynchronous, by name. A name must be unique among the collectives in flight. Arrays are host
// memory, or CUDA memory when NcclEnabled(): the NCCL stream then waits for the work queued on
// the array's stream (Array::WrapDevice) before reading it, and an allgather's result is a new
// array on the same GPU. Every rank must pass the same kind of memory under a name. `in` and `out`
// may be the same array (in place); they must stay untouched until the handle is done. Among the
// allreduces ready on every rank, those of higher `priority` (rank 0's) run first; equal ones in
// the order they became ready (the KVStore passes MXNet's priority: layers nearest the input,
// needed first by the next forward, overtake the backlog).
Handle AllreduceAsync(const std::string& name, const Array& in, const Array& out, ReduceOp op,
                      int priority = 0, int process_set = kGlobalProcessSet);
// Every rank's `in`, concatenated along the first dimension in rank order; the other dimensions
// must agree.
Handle AllgatherAsync(const std::string& name, const Array& in,
                      int process_set = kGlobalProcessSet);
// Root's `inout` into everyone's `inout`.
Handle BroadcastAsync(const std::string& name, const Array& inout, int root,
                      int process_set = kGlobalProcessSet);

// Horovod's alltoall: sends splits[r] rows (entries of the first dimension) of `in`, in order, to
// rank r; the handle's result() is every rank's rows for this one, in rank order, and
// received_rows() how many came from each. `splits` has one count per rank adding up to the first
// dimension (the other dimensions must agree across ranks). Host memory only.
Handle AlltoallAsync(const std::string& name, const Array& in, const std::vector<int64_t>& splits,
                     int process_set = kGlobalProcessSet);
// Horovod's reducescatter: `in` (the same shape on every rank) reduced by `op`, of which this
// rank's result() keeps its share of the rows: as even as can be, the lower ranks one more when
// the ranks do not divide the first dimension. Host memory only.
Handle ReducescatterAsync(const std::string& name, const Array& in, ReduceOp op,
                          int process_set = kGlobalProcessSet);
// Completes once every rank of the set has called it as often.
Handle BarrierAsync(int process_set = kGlobalProcessSet);

// Horovod's grouped collectives: while one of these lives, the collectives submitted to the
// process set's engine (by any thread) are held back, and its end announces them together, so
// that they are negotiated in one round and the allreduces among them share one fusion batch
// (within the fusion threshold). Without it the engine starts a round at the first submission,
// and the rest of a group follows in later ones. Submit only while holding: a handle waited for
// before the hold ends is never started and times out. The destructor releases (release() does
// it sooner; once).
class SubmittedTogether {
 public:
  explicit SubmittedTogether(int process_set = kGlobalProcessSet);
  ~SubmittedTogether();
  SubmittedTogether(const SubmittedTogether&) = delete;
  SubmittedTogether& operator=(const SubmittedTogether&) = delete;
  void release();

 private:
  std::function<void()> release_;
};

// Synchronous forms.
void Allreduce(const std::string& name, const Array& in, const Array& out, ReduceOp op);
Array Allgather(const std::string& name, const Array& in);
void Broadcast(const std::string& name, const Array& inout, int root);
void Barrier(int process_set = kGlobalProcessSet);
// Horovod's join: this rank has no more data; until every rank has joined it takes part in the
// others' allreduces with zeros. Returns the rank that joined last, once every rank has joined.
Handle JoinAsync();
int Join();

}  // namespace dtrain::collectives

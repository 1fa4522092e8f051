// device_communicator.h over NCCL, in NCCL's non-blocking mode: no NCCL call blocks the engine's
// thread, so every wait below can have a deadline and an abort.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>
#include <string>
#include <thread>

#include "collectives/nccl/device_communicator.h"
#include "collectives/nccl/hierarchy.h"
#include "common/elementwise.h"
#include "common/host_id.h"
#include "common/logging.h"
#include "cuda/cuda_check.h"
#include "cuda/pinned_pool.h"
#include "cuda/stream_order.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

using cuda::Check;
using cuda::DeviceGuard;

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
  }
  throw InvalidArgument("NCCL: no NCCL type for " + std::string(DTypeName(dtype)));
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kAdasum:  // the engine refuses device arrays for Adasum before this
      break;
  }
  throw InvalidArgument("NCCL: no NCCL reduction for op " + std::to_string(static_cast<int>(op)));
}

// What names a GPU across the job: its host and its PCI bus id. Fixed size: one allgather.
struct GpuIdentity {
  char host[64] = {};
  char host_id[192] = {};  // HostId(): which ranks share a host, as the host backend counts them
  char bus_id[32] = {};
};

// A communicator's NCCL id from its first member, or why it could not make one (every rank must
// hear either way). Fixed size: one allgather.
struct IdMessage {
  int32_t ok = 0;
  ncclUniqueId id = {};
  char why[96] = {};
};

std::string NcclText(ncclResult_t result) { return ncclGetErrorString(result); }

// Every rank sees the same list, so every rank throws the same error (or none). Compares the ranks
// of `ranks` only.
void RequireOneRankPerGpu(const std::vector<GpuIdentity>& gpus, const std::vector<int>& ranks);

class NcclCommunicator final : public DeviceCommunicator {
 public:
  // `gpus`: every rank's, from one allgather over `host`.
  NcclCommunicator(std::shared_ptr<Communicator> host, std::vector<GpuIdentity> gpus, int device,
                   Duration timeout, const std::atomic<bool>& abort)
      : host_(std::move(host)),
        gpus_(std::move(gpus)),
        rank_(host_->rank()),
        size_(host_->size()),
        device_(device),
        timeout_(timeout),
        abort_(abort) {
    DeviceGuard guard(device_);
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate for NCCL");
    const cudaError_t event = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    if (event != cudaSuccess) {
      cudaStreamDestroy(stream_);  // no destructor runs for a constructor that throws
      Check(event, "cudaEventCreate for NCCL");
    }
  }

  ~NcclCommunicator() override {
    DeviceGuard guard(device_);
    // Abort rather than destroy: every operation has finished by now (each call waits), and
    // ncclCommDestroy may wait for peers that have already left; ncclCommAbort never does.
    if (world_) ncclCommAbort(world_);
    if (local_) ncclCommAbort(local_);
    cross_.reset();
    if (fusion_) cudaFree(fusion_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Collective over the host backend: the communicator of every rank.
  void StartFlat() { World(); }

  // Collective over the host backend: this host's communicator and the cross-host group of this
  // rank's shard (hierarchy.h). The communicator of every rank waits for the first allgather or
  // broadcast, which need it.
  void StartHierarchical(NcclHierarchy plan) {
    for (const auto& ranks : plan.layout.host_ranks) RequireOneRankPerGpu(gpus_, ranks);
    hierarchy_ = std::move(plan);
    const HostLayout& layout = hierarchy_->layout;
    local_ = Join(layout.host_ranks, "each host's ranks");
    if (hierarchy_->cross_ranks.size() > 1) {
      try {
        cross_ = host_->Subset(hierarchy_->cross_ranks, kCrossHostGenerations + layout.local_rank);
      } catch (const ConfigError& e) {  // an MPI without MPI_THREAD_MULTIPLE: on every rank
        throw ConfigError(std::string("HOROVOD_HIERARCHICAL_ALLREDUCE=1: ") + e.what());
      }
    }
    DTRAIN_LOG(kConnections) << "collectives: hierarchical NCCL allreduce, rank " << rank_
                             << " is local rank " << layout.local_rank << " of "
                             << layout.mine().size() << " on one of " << layout.hosts() << " hosts";
  }

  void Allreduce(const std::vector<Array>& ins, const std::vector<Array>& outs,
                 ReduceOp op) override {
    Usable();
    DeviceGuard guard(device_);
    size_t total = 0;
    for (size_t i = 0; i < ins.size(); ++i) {
      Order(ins[i]);
      if (outs[i].data() != ins[i].data()) Order(outs[i]);  // the user may still read it
      total += static_cast<size_t>(ins[i].size());
    }
    if (total == 0) return;
    const DType dtype = ins[0].dtype();
    const std::string what = "allreduce of " + std::to_string(ins.size()) + " tensor(s)";
    if (hierarchy_) return HierarchicalAllreduce(ins, outs, op, total, what);
    if (ins.size() == 1) {
      Enqueued(ncclAllReduce(ins[0].data(), outs[0].data(), total, NcclType(dtype), NcclOp(op),
                             World(), stream_),
               what);
      Finish(what);
      return;
    }
    char* fusion = static_cast<char*>(Fusion(total * DTypeSize(dtype)));
    Pack(ins, fusion);
    Enqueued(ncclAllReduce(fusion, fusion, total, NcclType(dtype), NcclOp(op), World(), stream_),
             what);
    Unpack(fusion, outs);
    Finish(what);
  }

  Array Allgatherv(const Array& in, const Shape& shape, const std::vector<size_t>& bytes) override {
    Usable();
    DeviceGuard guard(device_);
    Order(in);
    size_t total = 0;
    for (size_t b : bytes) total += b;
    ncclComm_t world = World();  // first: a collective every rank makes, whatever fails after
    Array result = NewArray(shape, in.dtype());
    void* memory = result.data();
    // One broadcast from each rank, grouped: NCCL's allgather needs equal parts.
    Enqueued(ncclGroupStart(), "allgather");
    size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      if (bytes[r] > 0) {
        char* part = static_cast<char*>(memory) + offset;
        ncclResult_t status = ncclBroadcast(r == rank_ ? in.data() : part, part, bytes[r],
                                            ncclUint8, r, world, stream_);
        if (status != ncclSuccess && status != ncclInProgress) {
          ncclGroupEnd();
          Enqueued(status, "allgather");
        }
      }
      offset += bytes[r];
    }
    Enqueued(ncclGroupEnd(), "allgather");
    Finish("allgather");
    return result;
  }

  Array Identity(const Shape& shape, DType dtype, Reduction how) override {
    DeviceGuard guard(device_);
    Array identity = NewArray(shape, dtype);
    if (how == Reduction::kSum) {
      Check(cudaMemsetAsync(identity.data(), 0, identity.nbytes(), stream_), "cudaMemset");
    } else {
      // On NCCL's stream, which is non-blocking: a plain cudaMemcpy runs on the legacy default
      // stream, which that stream does not wait for. A copy from pageable memory has taken the
      // bytes when it returns, so `values` may go: a joined rank's stand-in, rare and small.
      std::vector<char> values(identity.nbytes());
      FillIdentity(values.data(), static_cast<size_t>(identity.size()), dtype, how);
      Check(cudaMemcpyAsync(identity.data(), values.data(), values.size(), cudaMemcpyHostToDevice,
                            stream_),
            "copy of a joined rank's stand-in");
    }
    return identity;  // NCCL's stream fills it before it runs anything queued later
  }

  void Broadcast(const Array& inout, int root) override {
    Usable();
    DeviceGuard guard(device_);
    Order(inout);
    if (inout.nbytes() == 0) return;
    ncclComm_t world = World();
    Enqueued(
        ncclBroadcast(inout.data(), inout.data(), inout.nbytes(), ncclUint8, root, world, stream_),
        "broadcast");
    Finish("broadcast");
  }

 private:
  // Throws the error that broke the communicator, if one did.
  void Usable() const {
    if (broken_) std::rethrow_exception(broken_);
  }

  // The communicator of every rank; made on first use (a collective over the host backend, which
  // every rank reaches at the same point of the agreed order).
  ncclComm_t World() {
    if (!world_) {
      std::vector<int> everyone(static_cast<size_t>(size_));
      std::iota(everyone.begin(), everyone.end(), 0);
      RequireOneRankPerGpu(gpus_, everyone);
      world_ = Join({everyone}, "the job");
    }
    return world_;
  }

  // Collective over the host backend: an NCCL communicator for each of `groups` (ranks of the job,
  // each ascending; every rank in one), whose first member makes its id; returns this rank's. One
  // allgather carries every group's id, and every rank checks them all, so that all fail alike.
  ncclComm_t Join(const std::vector<std::vector<int>>& groups, const std::string& what) {
    // NCCL binds a communicator to the device current on the calling thread, and StartFlat and
    // StartHierarchical run outside the constructor's guard.
    DeviceGuard guard(device_);
    const std::vector<int>* found = nullptr;
    for (const auto& group : groups) {
      if (std::binary_search(group.begin(), group.end(), rank_)) found = &group;
    }
    if (!found) throw Error("NCCL: rank " + std::to_string(rank_) + " is in none of " + what);
    const std::vector<int>& members = *found;
    IdMessage mine;
    if (members.front() == rank_) {
      const ncclResult_t status = ncclGetUniqueId(&mine.id);
      mine.ok = status == ncclSuccess ? 1 : 0;
      if (!mine.ok) std::strncpy(mine.why, NcclText(status).c_str(), sizeof(mine.why) - 1);
    }
    std::vector<IdMessage> ids(static_cast<size_t>(size_));
    host_->Allgatherv(&mine, ids.data(), std::vector<size_t>(ids.size(), sizeof(IdMessage)));
    for (const auto& group : groups) {
      const IdMessage& message = ids[group.front()];
      if (!message.ok) {
        const std::string why(message.why, strnlen(message.why, sizeof(message.why)));
        throw Error("NCCL: rank " + std::to_string(group.front()) +
                    " could not make the NCCL id of " + what + (why.empty() ? "" : ": " + why));
      }
    }
    const IdMessage& first = ids[members.front()];
    const int index =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t status =
        ncclCommInitRankConfig(&comm, static_cast<int>(members.size()), first.id, index, &config);
    setting_up_ = comm;  // polled (and aborted on failure) until it is ready
    Enqueued(status, "setup of the communicator of " + what);
    setting_up_ = nullptr;
    return comm;
  }

  // Horovod's hierarchical allreduce (hierarchy.h), in the fusion buffer padded to whole shards:
  // an NCCL reduce-scatter within the host, this rank's shard allreduced in host memory with the
  // ranks holding it on the other hosts, an NCCL allgather within the host. An average is one
  // within the host and one across: hosts hold equal numbers of ranks.
  void HierarchicalAllreduce(const std::vector<Array>& ins, const std::vector<Array>& outs,
                             ReduceOp op, size_t total, const std::string& what) {
    const DType dtype = ins[0].dtype();
    const size_t element = DTypeSize(dtype);
    const int local_size = static_cast<int>(hierarchy_->layout.mine().size());
    const size_t shard = ShardElements(total, local_size);
    const size_t padded = shard * static_cast<size_t>(local_size);
    char* fusion = static_cast<char*>(Fusion(padded * element));
    Pack(ins, fusion);
    if (padded > total) {
      Check(cudaMemsetAsync(fusion + total * element, 0, (padded - total) * element, stream_),
            "cudaMemset of the fusion buffer's padding");
    }
    char* mine = fusion + static_cast<size_t>(hierarchy_->layout.local_rank) * shard * element;
    const std::string within = what + " within the host";
    if (local_size > 1) {
      Enqueued(ncclReduceScatter(fusion, mine, shard, NcclType(dtype), NcclOp(op), local_, stream_),
               within);
    }
    if (cross_) {
      void* staged = Pinned(shard * element);
      Check(cudaMemcpyAsync(staged, mine, shard * element, cudaMemcpyDeviceToHost, stream_),
            "copy of the host's shard to host memory");
      Finish(within);
      try {
        cross_->Allreduce(staged, staged, shard, dtype, op);
      } catch (...) {
        Break(std::current_exception());
      }
      Check(cudaMemcpyAsync(mine, staged, shard * element, cudaMemcpyHostToDevice, stream_),
            "copy of the reduced shard back to the GPU");
    }
    if (local_size > 1) {
      Enqueued(ncclAllGather(mine, fusion, shard, NcclType(dtype), local_, stream_), within);
    }
    Unpack(fusion, outs);
    Finish(what);
  }

  // Queues the copies of `ins`, end to end, into `fusion`.
  void Pack(const std::vector<Array>& ins, char* fusion) {
    size_t offset = 0;
    for (const Array& in : ins) {
      Check(cudaMemcpyAsync(fusion + offset, in.data(), in.nbytes(), cudaMemcpyDeviceToDevice,
                            stream_),
            "copy into the fusion buffer");
      offset += in.nbytes();
    }
  }

  // Queues the copies out of `fusion` into `outs`, end to end.
  void Unpack(const char* fusion, const std::vector<Array>& outs) {
    size_t offset = 0;
    for (const Array& out : outs) {
      Check(cudaMemcpyAsync(out.data(), fusion + offset, out.nbytes(), cudaMemcpyDeviceToDevice,
                            stream_),
            "copy out of the fusion buffer");
      offset += out.nbytes();
    }
  }

  // NCCL's stream waits for the work queued on `a`'s producer stream.
  void Order(const Array& a) {
    if (!a.on_device() || a.device() != device_) {
      throw InvalidArgument("NCCL: an array on " +
                            (a.on_device() ? "GPU " + std::to_string(a.device()) : "the host") +
                            " was given to the communicator of GPU " + std::to_string(device_));
    }
    cuda::OrderAfterProducer(a, stream_);
  }

  // Device memory of its own (the caching allocator is torch's, not ours); freed by cudaFree,
  // which waits for the device, so the user's kernels that read it are done by then.
  Array NewArray(const Shape& shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
    void* memory = nullptr;
    Check(cudaMalloc(&memory, std::max<size_t>(bytes, 1)), "cudaMalloc");
    std::shared_ptr<void> owner(memory, [device = device_](void* p) {
      DeviceGuard guard(device);
      cudaFree(p);
    });
    return Array::WrapDevice(memory, shape, dtype, device_, stream_, owner);
  }

  // Pinned host memory for a shard's trip across hosts, from the process's pool; kept while it is
  // big enough, so that a copy a failed call left behind never writes into a buffer reused
  // elsewhere. Only the engine's thread uses it.
  void* Pinned(size_t bytes) {
    if (bytes > pinned_bytes_) {
      pinned_ = cuda::PinnedPool::Default().Get(bytes);
      pinned_bytes_ = bytes;
    }
    return pinned_.get();
  }

  void* Fusion(size_t bytes) {
    if (bytes > fusion_bytes_) {
      if (fusion_) Check(cudaFree(fusion_), "cudaFree of the fusion buffer");
      fusion_ = nullptr;
      fusion_bytes_ = 0;
      Check(cudaMalloc(&fusion_, bytes), "cudaMalloc of the fusion buffer");
      fusion_bytes_ = bytes;
    }
    return fusion_;
  }

  // An NCCL call's immediate result: queued (or in progress, in non-blocking mode) or failed.
  // Then waits until NCCL has taken it, as non-blocking mode asks before the next call.
  void Enqueued(ncclResult_t status, const std::string& what) {
    if (status != ncclSuccess && status != ncclInProgress) Fail(status, what);
    WaitUntil(what, [] { return true; });
  }

  // Waits until the work queued on NCCL's stream so far has finished.
  void Finish(const std::string& what) {
    Check(cudaEventRecord(done_, stream_), "cudaEventRecord after NCCL");
    WaitUntil(what, [this, &what] {
      const cudaError_t status = cudaEventQuery(done_);
      if (status == cudaSuccess) return true;
      if (status != cudaErrorNotReady) {
        Break(std::make_exception_ptr(
            Error("NCCL " + what + ": the GPU failed: " + cudaGetErrorString(status))));
      }
      cudaGetLastError();  // "not ready" may stay as the last error
      return false;
    });
  }

  // Polls until NCCL's state has settled and `done` holds: bounded by the deadline and the abort
  // flag.
  template <typename Done>
  void WaitUntil(const std::string& what, Done done) {
    const Deadline deadline(timeout_);
    const auto spin_until = Clock::now() + std::chrono::milliseconds(2);
    for (;;) {
      bool settled = true;
      for (ncclComm_t comm : {world_, local_, setting_up_}) {
        if (!comm) continue;
        ncclResult_t state = ncclSuccess;
        const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
        if (asked != ncclSuccess) Fail(asked, what);
        if (state != ncclSuccess && state != ncclInProgress) Fail(state, what, comm);
        if (state == ncclInProgress) settled = false;
      }
      if (settled && done()) return;
      if (abort_.load(std::memory_order_relaxed)) {
        Break(std::make_exception_ptr(PeerError(
            "NCCL " + what + " was abandoned: a rank left the job (see the error naming it)")));
      }
      if (deadline.passed()) {
        Break(std::make_exception_ptr(TimeoutError(
            "NCCL " + what + " did not finish within " + std::to_string(Seconds(timeout_)) +
            " s (DTRAIN_COLLECTIVE_TIMEOUT_MS): a rank may be stuck, or the work queued on the "
            "tensor's stream before it has not ended")));
      }
      if (Clock::now() < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // `comm`: the communicator that reported it, whose last error is added.
  [[noreturn]] void Fail(ncclResult_t status, const std::string& what, ncclComm_t comm = nullptr) {
    std::string text = "NCCL " + what + " failed: " + NcclText(status);
    if (comm) {
      const char* last = ncclGetLastError(comm);
      if (last && *last) text += " (" + std::string(last) + ")";
    }
    // A remote or system error is a rank gone or unreachable; the rest are this process's.
    if (status == ncclRemoteError || status == ncclSystemError) {
      Break(std::make_exception_ptr(PeerError(text)));
    }
    Break(std::make_exception_ptr(Error(text)));
  }

  // Aborts the communicators (so nothing stays queued waiting for a peer) and throws `error` now
  // and from every later call.
  [[noreturn]] void Break(std::exception_ptr error) {
    broken_ = error;
    for (ncclComm_t* comm : {&world_, &local_, &setting_up_}) {
      if (*comm) ncclCommAbort(*comm);
      *comm = nullptr;
    }
    std::rethrow_exception(error);
  }

  const std::shared_ptr<Communicator> host_;
  const std::vector<GpuIdentity> gpus_;
  const int rank_;
  const int size_;
  const int device_;
  const Duration timeout_;
  const std::atomic<bool>& abort_;
  ncclComm_t world_ = nullptr;       // every rank's; lazy under a hierarchy
  ncclComm_t local_ = nullptr;       // this host's ranks' (hierarchy only)
  ncclComm_t setting_up_ = nullptr;  // one being made by Join
  std::optional<NcclHierarchy> hierarchy_;
  std::unique_ptr<Communicator> cross_;  // the hierarchy's group across hosts; null on one host
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* fusion_ = nullptr;
  size_t fusion_bytes_ = 0;
  std::shared_ptr<char> pinned_;
  size_t pinned_bytes_ = 0;
  std::exception_ptr broken_;
};

GpuIdentity IdentityOf(int device) {
  GpuIdentity me;
  gethostname(me.host, sizeof(me.host) - 1);
  std::strncpy(me.host_id, HostId().c_str(), sizeof(me.host_id) - 1);
  Check(cudaDeviceGetPCIBusId(me.bus_id, sizeof(me.bus_id) - 1, device), "cudaDeviceGetPCIBusId");
  return me;
}

void RequireOneRankPerGpu(const std::vector<GpuIdentity>& gpus, const std::vector<int>& ranks) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (size_t j = i + 1; j < ranks.size(); ++j) {
      const GpuIdentity& a = gpus[ranks[i]];
      const GpuIdentity& b = gpus[ranks[j]];
      if (std::strcmp(a.host, b.host) == 0 && std::strcmp(a.bus_id, b.bus_id) == 0) {
        throw InvalidArgument(
            "NCCL needs one GPU per rank, but ranks " + std::to_string(ranks[i]) + " and " +
            std::to_string(ranks[j]) + " both use the GPU at PCI " + a.bus_id + " of host " +
            a.host +
            ": give each rank its own GPU (torch.cuda.set_device(hvd.local_rank())), or set "
            "HOROVOD_GPU_OPERATIONS=GLOO to reduce CUDA tensors through host memory");
      }
    }
  }
}

}  // namespace

bool NcclBuilt() { return true; }
int NcclVersion() { return NCCL_VERSION_CODE; }

std::unique_ptr<DeviceCommunicator> CreateNcclCommunicator(std::shared_ptr<Communicator> host,
                                                           int device, Duration timeout,
                                                           const std::atomic<bool>& abort,
                                                           bool hierarchical) {
  const int size = host->size();
  const GpuIdentity mine = IdentityOf(device);
  std::vector<GpuIdentity> gpus(static_cast<size_t>(size));
  host->Allgatherv(&mine, gpus.data(), std::vector<size_t>(size, sizeof(GpuIdentity)));
  std::optional<NcclHierarchy> plan;
  if (hierarchical) {
    std::vector<std::string> host_ids;
    for (const GpuIdentity& gpu : gpus) host_ids.emplace_back(gpu.host_id);
    std::string why;
    plan = PlanHierarchy(host_ids, host->rank(), &why);
    if (!plan && host->rank() == 0) {
      DTRAIN_LOG(kWarning) << "collectives: " << why
                           << "; NCCL allreduces use one communicator of every rank instead";
    }
  }
  auto communicator =
      std::make_unique<NcclCommunicator>(std::move(host), std::move(gpus), device, timeout, abort);
  if (plan) {
    communicator->StartHierarchical(std::move(*plan));
  } else {
    communicator->StartFlat();
  }
  return communicator;
}

}  // namespace dtrain::collectives

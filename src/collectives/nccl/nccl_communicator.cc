// device_communicator.h over NCCL, in NCCL's non-blocking mode: no NCCL call blocks the engine's
// thread, so every wait below can have a deadline and an abort.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "collectives/nccl/device_communicator.h"
#include "common/elementwise.h"
#include "cuda/cuda_check.h"
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
  char bus_id[32] = {};
};

// Rank 0's NCCL id, or why it could not make one (the others must hear either way).
struct IdMessage {
  int32_t ok = 0;
  ncclUniqueId id = {};
};

std::string NcclText(ncclResult_t result) { return ncclGetErrorString(result); }

class NcclCommunicator final : public DeviceCommunicator {
 public:
  NcclCommunicator(int rank, int size, int device, Duration timeout, const std::atomic<bool>& abort)
      : rank_(rank), size_(size), device_(device), timeout_(timeout), abort_(abort) {}

  ~NcclCommunicator() override {
    DeviceGuard guard(device_);
    // Abort rather than destroy: every operation has finished by now (each call waits), and
    // ncclCommDestroy may wait for peers that have already left; ncclCommAbort never does.
    if (comm_) ncclCommAbort(comm_);
    if (fusion_) cudaFree(fusion_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void Start(const ncclUniqueId& id) {
    DeviceGuard guard(device_);
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate for NCCL");
    Check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate for NCCL");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    Enqueued(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "setup");
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
    const ncclRedOp_t nccl_op = NcclOp(op);
    const std::string what = "allreduce of " + std::to_string(ins.size()) + " tensor(s)";
    if (ins.size() == 1) {
      Enqueued(ncclAllReduce(ins[0].data(), outs[0].data(), total, NcclType(dtype), nccl_op, comm_,
                             stream_),
               what);
      Finish(what);
      return;
    }
    const size_t element = DTypeSize(dtype);
    char* fusion = static_cast<char*>(Fusion(total * element));
    size_t offset = 0;
    for (const Array& in : ins) {
      Check(cudaMemcpyAsync(fusion + offset, in.data(), in.nbytes(), cudaMemcpyDeviceToDevice,
                            stream_),
            "copy into the fusion buffer");
      offset += in.nbytes();
    }
    Enqueued(ncclAllReduce(fusion, fusion, total, NcclType(dtype), nccl_op, comm_, stream_), what);
    offset = 0;
    for (const Array& out : outs) {
      Check(cudaMemcpyAsync(out.data(), fusion + offset, out.nbytes(), cudaMemcpyDeviceToDevice,
                            stream_),
            "copy out of the fusion buffer");
      offset += out.nbytes();
    }
    Finish(what);
  }

  Array Allgatherv(const Array& in, const Shape& shape, const std::vector<size_t>& bytes) override {
    Usable();
    DeviceGuard guard(device_);
    Order(in);
    size_t total = 0;
    for (size_t b : bytes) total += b;
    Array result = NewArray(shape, in.dtype());
    void* memory = result.data();
    // One broadcast from each rank, grouped: NCCL's allgather needs equal parts.
    Enqueued(ncclGroupStart(), "allgather");
    size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      if (bytes[r] > 0) {
        char* part = static_cast<char*>(memory) + offset;
        ncclResult_t status = ncclBroadcast(r == rank_ ? in.data() : part, part, bytes[r],
                                            ncclUint8, r, comm_, stream_);
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
      // Synchronous, so that `values` may go: a joined rank's stand-in, rare and small. NCCL's
      // stream has nothing queued between collectives (each one finishes before the next).
      std::vector<char> values(identity.nbytes());
      FillIdentity(values.data(), static_cast<size_t>(identity.size()), dtype, how);
      Check(cudaMemcpy(identity.data(), values.data(), values.size(), cudaMemcpyHostToDevice),
            "copy of a joined rank's stand-in");
    }
    return identity;  // NCCL's stream fills it before it runs anything queued later
  }

  void Broadcast(const Array& inout, int root) override {
    Usable();
    DeviceGuard guard(device_);
    Order(inout);
    if (inout.nbytes() == 0) return;
    Enqueued(
        ncclBroadcast(inout.data(), inout.data(), inout.nbytes(), ncclUint8, root, comm_, stream_),
        "broadcast");
    Finish("broadcast");
  }

 private:
  // Throws the error that broke the communicator, if one did.
  void Usable() const {
    if (broken_) std::rethrow_exception(broken_);
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
      ncclResult_t state = ncclSuccess;
      const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
      if (asked != ncclSuccess) Fail(asked, what);
      if (state != ncclSuccess && state != ncclInProgress) Fail(state, what);
      if (state == ncclSuccess && done()) return;
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

  [[noreturn]] void Fail(ncclResult_t status, const std::string& what) {
    std::string text = "NCCL " + what + " failed: " + NcclText(status);
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) text += " (" + std::string(last) + ")";
    }
    // A remote or system error is a rank gone or unreachable; the rest are this process's.
    if (status == ncclRemoteError || status == ncclSystemError) {
      Break(std::make_exception_ptr(PeerError(text)));
    }
    Break(std::make_exception_ptr(Error(text)));
  }

  // Aborts the communicator (so nothing stays queued waiting for a peer) and throws `error` now
  // and from every later call.
  [[noreturn]] void Break(std::exception_ptr error) {
    broken_ = error;
    if (comm_) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    std::rethrow_exception(error);
  }

  const int rank_;
  const int size_;
  const int device_;
  const Duration timeout_;
  const std::atomic<bool>& abort_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* fusion_ = nullptr;
  size_t fusion_bytes_ = 0;
  std::exception_ptr broken_;
};

GpuIdentity IdentityOf(int device) {
  GpuIdentity me;
  gethostname(me.host, sizeof(me.host) - 1);
  Check(cudaDeviceGetPCIBusId(me.bus_id, sizeof(me.bus_id) - 1, device), "cudaDeviceGetPCIBusId");
  return me;
}

// Every rank sees the same list, so every rank throws the same error (or none).
void RequireOneRankPerGpu(const std::vector<GpuIdentity>& gpus) {
  for (size_t a = 0; a < gpus.size(); ++a) {
    for (size_t b = a + 1; b < gpus.size(); ++b) {
      if (std::strcmp(gpus[a].host, gpus[b].host) == 0 &&
          std::strcmp(gpus[a].bus_id, gpus[b].bus_id) == 0) {
        throw InvalidArgument(
            "NCCL needs one GPU per rank, but ranks " + std::to_string(a) + " and " +
            std::to_string(b) + " both use the GPU at PCI " + gpus[a].bus_id + " of host " +
            gpus[a].host +
            ": give each rank its own GPU (torch.cuda.set_device(hvd.local_rank())), or set "
            "HOROVOD_GPU_OPERATIONS=GLOO to reduce CUDA tensors through host memory");
      }
    }
  }
}

}  // namespace

bool NcclBuilt() { return true; }

std::unique_ptr<DeviceCommunicator> CreateNcclCommunicator(Communicator& host, int device,
                                                           Duration timeout,
                                                           const std::atomic<bool>& abort) {
  const int rank = host.rank();
  const int size = host.size();
  const GpuIdentity mine = IdentityOf(device);
  std::vector<GpuIdentity> gpus(static_cast<size_t>(size));
  host.Allgatherv(&mine, gpus.data(), std::vector<size_t>(size, sizeof(GpuIdentity)));
  RequireOneRankPerGpu(gpus);

  IdMessage message;
  std::string why;
  if (rank == 0) {
    const ncclResult_t status = ncclGetUniqueId(&message.id);
    message.ok = status == ncclSuccess ? 1 : 0;
    if (!message.ok) why = NcclText(status);
  }
  host.Broadcast(&message, sizeof(message), 0);
  if (!message.ok) {
    throw Error("NCCL: rank 0 could not make the job's NCCL id" +
                (why.empty() ? std::string() : ": " + why));
  }
  auto communicator = std::make_unique<NcclCommunicator>(rank, size, device, timeout, abort);
  communicator->Start(message.id);
  return communicator;
}

}  // namespace dtrain::collectives

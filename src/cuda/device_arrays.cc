// cuda.h with the CUDA runtime: copies on one non-blocking stream per device, ordered after the
// producer's stream by an event, then one wait for all of them.
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "common/config/config.h"
#include "cuda/cuda.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/pinned_pool.h"
#include "cuda/stream_order.h"
#include "dtrain/common/deadline.h"

namespace dtrain::cuda {
namespace {

// dtrain's own stream on each device, made on first use and kept for the process's life (arrays
// freed during exit still queue their frees on it).
cudaStream_t CopyStream(int device) {
  static std::mutex mutex;
  static auto* streams = new std::map<int, cudaStream_t>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams->find(device);
  if (it != streams->end()) return it->second;
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  streams->emplace(device, stream);
  return stream;
}

void RequireDevice(const Array& a, const char* what) {
  if (!a.on_device()) throw InvalidArgument(std::string(what) + ": the array is not on a device");
}

void RequireSameLayout(const Array& a, const Array& b, const char* what) {
  if (a.size() != b.size() || a.dtype() != b.dtype()) {
    throw InvalidArgument(std::string(what) + ": " + ShapeToString(a.shape()) + " " +
                          std::string(DTypeName(a.dtype())) + " and " + ShapeToString(b.shape()) +
                          " " + std::string(DTypeName(b.dtype())) + " differ");
  }
}

// A device buffer of `bytes` on `device`, allocated and freed in `stream`'s order.
std::shared_ptr<void> DeviceBuffer(int device, size_t bytes, cudaStream_t stream) {
  DeviceGuard guard(device);
  void* p = nullptr;
  Check(cudaMallocAsync(&p, bytes > 0 ? bytes : 1, stream), "cudaMallocAsync");
  return std::shared_ptr<void>(p, [device, stream](void* q) {
    DeviceGuard guard(device);
    cudaFreeAsync(q, stream);
  });
}

// Waits for the work queued on `stream` (its device current). That work waits in turn for the
// producer's stream, where a user's kernel may never end: past the job's request timeout this is a
// TimeoutError instead of a hang. Polls as cudaStreamSynchronize's default (spin) mode does, then
// sleeps briefly once the wait is long.
void WaitFor(cudaStream_t stream, const char* what) {
  static const Duration timeout = Config::FromEnvironment().request_timeout;
  const Deadline deadline(timeout);
  const auto spin_until = Clock::now() + std::chrono::milliseconds(2);
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) Check(status, what);
    cudaGetLastError();  // "not ready" may stay as the last error: clear it for later launches
    if (deadline.passed()) {
      throw TimeoutError(std::string("CUDA: ") + what + " did not finish within " +
                         std::to_string(Seconds(timeout)) +
                         " s (DTRAIN_REQUEST_TIMEOUT_MS): the work queued on the tensor's stream "
                         "before it has not ended");
    }
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void Wait(const std::map<int, cudaStream_t>& streams, const char* what) {
  for (auto [device, stream] : streams) {
    DeviceGuard guard(device);
    WaitFor(stream, what);
  }
}

}  // namespace

void OrderAfterProducer(const Array& array, cudaStream_t stream) {
  DeviceGuard guard(array.device());
  cudaEvent_t event = nullptr;
  Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t status = cudaEventRecord(event, static_cast<cudaStream_t>(array.stream()));
  if (status == cudaSuccess) status = cudaStreamWaitEvent(stream, event, 0);
  cudaEventDestroy(event);  // released once the wait has happened
  Check(status, "ordering after the tensor's stream");
}

bool Built() { return true; }

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string Unavailable() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so that it does not surface from a later call
    return std::string("no usable CUDA device: ") + cudaGetErrorString(status);
  }
  return n > 0 ? "" : "no CUDA device";
}

Array PinnedLike(const Array& like) {
  auto buffer = PinnedPool::Default().Get(like.nbytes());
  return Array::Wrap(buffer.get(), like.shape(), like.dtype(), buffer);
}

std::vector<Array> ToHost(const std::vector<Array>& arrays) {
  std::vector<Array> hosts;
  std::map<int, cudaStream_t> used;
  for (const Array& a : arrays) {
    if (!a.on_device()) {
      hosts.push_back(a);
      continue;
    }
    Array host = PinnedLike(a);
    cudaStream_t stream = CopyStream(a.device());
    DeviceGuard guard(a.device());
    OrderAfterProducer(a, stream);
    Check(cudaMemcpyAsync(host.data(), a.data(), a.nbytes(), cudaMemcpyDeviceToHost, stream),
          "copy to the host");
    used[a.device()] = stream;
    hosts.push_back(std::move(host));
  }
  Wait(used, "copy to the host");
  return hosts;
}

Array ToHost(const Array& array) { return ToHost(std::vector<Array>{array})[0]; }

void CopyFromHost(const Array& host, const std::vector<Array>& devices) {
  host.RequireHost("CopyFromHost");
  std::map<int, cudaStream_t> used;
  for (const Array& d : devices) {
    RequireSameLayout(host, d, "copy from the host");
    if (!d.on_device()) {
      d.CopyFrom(host);
      continue;
    }
    cudaStream_t stream = CopyStream(d.device());
    DeviceGuard guard(d.device());
    OrderAfterProducer(d, stream);  // the user's queued work may still read the old values
    Check(cudaMemcpyAsync(d.data(), host.data(), d.nbytes(), cudaMemcpyHostToDevice, stream),
          "copy to the device");
    used[d.device()] = stream;
  }
  Wait(used, "copy to the device");
}

Array CloneOnDevice(const Array& like) {
  RequireDevice(like, "CloneOnDevice");
  cudaStream_t stream = CopyStream(like.device());
  DeviceGuard guard(like.device());
  auto buffer = DeviceBuffer(like.device(), like.nbytes(), stream);
  OrderAfterProducer(like, stream);
  Check(cudaMemcpyAsync(buffer.get(), like.data(), like.nbytes(), cudaMemcpyDeviceToDevice, stream),
        "copy on the device");
  WaitFor(stream, "copy on the device");
  return Array::WrapDevice(buffer.get(), like.shape(), like.dtype(), like.device(), stream, buffer);
}

void AddInto(const Array& dst, const Array& src) {
  RequireDevice(dst, "AddInto");
  RequireDevice(src, "AddInto");
  RequireSameLayout(dst, src, "AddInto");
  cudaStream_t stream = CopyStream(dst.device());
  DeviceGuard guard(dst.device());
  OrderAfterProducer(dst, stream);
  OrderAfterProducer(src, stream);
  const void* from = src.data();
  std::shared_ptr<void> peer_copy;
  if (src.device() != dst.device()) {
    peer_copy = DeviceBuffer(dst.device(), src.nbytes(), stream);
    Check(cudaMemcpyPeerAsync(peer_copy.get(), dst.device(), src.data(), src.device(), src.nbytes(),
                              stream),
          "peer copy between devices");
    from = peer_copy.get();
  }
  Check(LaunchAddInto(dst.data(), from, dst.size(), dst.dtype(), stream), "sum on the device");
  WaitFor(stream, "sum on the device");
}

}  // namespace dtrain::cuda

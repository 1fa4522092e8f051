// cuda.h with the CUDA runtime: copies on one non-blocking stream per device, ordered after the
// producer's stream by an event; the Start* forms hand back a Fence (events recorded after them)
// instead of waiting.
#include <algorithm>
#include <chrono>
#include <cstring>
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

// What a stream of dtrain's is for: copies and sums (each device's copy stream, which the users'
// streams are ordered with), or filling new memory that the caller waits for (NewOnDevice: on the
// copy stream that wait would include every copy queued there, and so the users' work those copies
// wait for).
enum class StreamUse { kCopies, kFills };

// dtrain's own stream of `use` on each device, made on first use and kept for the process's life
// (arrays freed during exit still queue their frees on it).
cudaStream_t OwnStream(int device, StreamUse use) {
  static std::mutex mutex;
  static auto* streams = new std::map<std::pair<int, StreamUse>, cudaStream_t>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams->find({device, use});
  if (it != streams->end()) return it->second;
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // The snapshots of every round come from the device's default pool (cudaMallocAsync): keep what
  // they free for the next round instead of returning it to the driver at each synchronisation.
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  cudaGetLastError();
  streams->emplace(std::make_pair(device, use), stream);
  return stream;
}

cudaStream_t CopyStream(int device) { return OwnStream(device, StreamUse::kCopies); }
cudaStream_t FillStream(int device) { return OwnStream(device, StreamUse::kFills); }

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

// Polls `query` (cudaStreamQuery or cudaEventQuery of work on dtrain's streams) until it reports
// the work done. That work waits in turn for the producer's stream, where a user's kernel may never
// end: past the job's request timeout this is a TimeoutError instead of a hang. Polls as
// cudaStreamSynchronize's default (spin) mode does, then sleeps briefly once the wait is long.
template <typename Query>
void PollUntilDone(Query query, const std::string& what) {
  static const Duration timeout = Config::FromEnvironment().request_timeout;
  const Deadline deadline(timeout);
  const auto spin_until = Clock::now() + std::chrono::milliseconds(2);
  for (;;) {
    const cudaError_t status = query();
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) Check(status, what.c_str());
    cudaGetLastError();  // "not ready" may stay as the last error: clear it for later launches
    if (deadline.passed()) {
      throw TimeoutError("CUDA: " + what + " did not finish within " +
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

// Waits for the work queued on `stream` (its device current).
void WaitFor(cudaStream_t stream, const char* what) {
  PollUntilDone([stream] { return cudaStreamQuery(stream); }, what);
}

// An event recorded on `stream` now (its device current).
cudaEvent_t RecordNow(cudaStream_t stream, const char* what) {
  cudaEvent_t event = nullptr;
  Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t status = cudaEventRecord(event, stream);
  if (status != cudaSuccess) {
    cudaEventDestroy(event);
    Check(status, what);
  }
  return event;
}

void WaitOnEvent(cudaStream_t stream, cudaEvent_t event,
                 const char* what = "ordering after the snapshot") {
  const cudaError_t status = cudaStreamWaitEvent(stream, event, 0);
  cudaEventDestroy(event);  // released once the wait has happened
  Check(status, what);
}

// Makes `stream`, a stream of `device` (null: that device's legacy default stream), wait for the
// work queued so far on `array`'s stream: an event recorded there with the array's device current,
// waited on with `device` current (which decides whose legacy stream a null one is).
void WaitForProducer(const Array& array, cudaStream_t stream, int device) {
  cudaEvent_t event = nullptr;
  {
    DeviceGuard guard(array.device());
    event =
        RecordNow(static_cast<cudaStream_t>(array.stream()), "ordering after the tensor's stream");
  }
  DeviceGuard guard(device);
  WaitOnEvent(stream, event, "ordering after the tensor's stream");
}

}  // namespace

void OrderAfterProducer(const Array& array, cudaStream_t stream) {
  WaitForProducer(array, stream, array.device());  // `stream` is dtrain's: never null
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

struct Fence::State {
  std::vector<std::pair<int, cudaEvent_t>> events;  // one per device whose stream did work
  ~State() {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;
    for (auto [device, event] : events) {
      cudaSetDevice(device);
      cudaEventDestroy(event);  // released by CUDA once it has happened
    }
    cudaSetDevice(previous);
  }
};

void Fence::Wait(const std::string& what) const {
  if (!state_) return;
  for (const auto& device_event : state_->events) {
    DeviceGuard guard(device_event.first);
    // A copy, not the structured binding: clang (the fuzz build) refuses to capture those.
    const cudaEvent_t event = device_event.second;
    PollUntilDone([event] { return cudaEventQuery(event); }, what);
  }
}

namespace {

// Marks the end of the work queued so far on each of `used`'s streams: (device, stream) pairs.
template <typename DeviceStreams>
Fence FenceAfter(const DeviceStreams& used, const char* what) {
  auto state = std::make_shared<Fence::State>();
  for (const auto& [device, stream] : used) {
    DeviceGuard guard(device);
    state->events.emplace_back(device, RecordNow(stream, what));
  }
  return Fence(std::move(state));
}

// Runs `queue`, which queues copies on dtrain's streams and names each stream in `used` before it
// queues anything there, and returns the fence after them (FenceAfter, naming `what`). If either
// throws, the copies queued may still read or write host buffers that the caller lets go on the
// error (pinned ones go back to their pool for the next round): they are waited for first
// (bounded by the job's timeout; if that wait fails too, the GPU itself has failed), then the
// error goes on.
template <typename Queue>
Fence QueueCopies(std::map<int, cudaStream_t>& used, const char* what, Queue&& queue) {
  try {
    queue();
    return FenceAfter(used, what);
  } catch (...) {
    try {
      FenceAfter(used, "copies queued before an error").Wait("copies queued before an error");
    } catch (...) {
    }
    throw;
  }
}

// A copy of `a`'s device value in a buffer of dtrain's, made on `a`'s own stream: in order after
// the work that produced it and before anything queued there later, so the producer may overwrite
// `a` at once. `stream` (dtrain's, on any device) is made to wait for the copy; the buffer is
// freed on dtrain's stream of its device, in that stream's order.
std::shared_ptr<void> Snapshot(const Array& a, cudaStream_t stream) {
  const int device = a.device();
  cudaStream_t release = CopyStream(device);
  DeviceGuard guard(device);
  auto producer = static_cast<cudaStream_t>(a.stream());
  void* p = nullptr;
  Check(cudaMallocAsync(&p, a.nbytes() > 0 ? a.nbytes() : 1, producer), "cudaMallocAsync");
  std::shared_ptr<void> buffer(p, [device, release](void* q) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaFreeAsync(q, release);
    cudaSetDevice(previous);
  });
  Check(cudaMemcpyAsync(p, a.data(), a.nbytes(), cudaMemcpyDeviceToDevice, producer),
        "copy on the device");
  WaitOnEvent(stream, RecordNow(producer, "copy on the device"));
  return buffer;
}

// Queues the copy of `source` (device memory of `device`, current) into `host` on `stream`: in
// pieces of `piece_bytes` where that is non-zero and smaller than the array, each but the last
// followed by an event. Returns those pieces' prefixes (none for a single copy).
std::vector<CopiedPrefix> CopyToHost(const Array& host, const void* source, int device,
                                     cudaStream_t stream, size_t piece_bytes) {
  const size_t bytes = host.nbytes();
  const size_t piece = piece_bytes > 0 && piece_bytes < bytes ? piece_bytes : bytes;
  std::vector<CopiedPrefix> prefixes;
  size_t copied = 0;
  do {
    const size_t length = std::min(piece, bytes - copied);
    Check(cudaMemcpyAsync(host.bytes() + copied, static_cast<const char*>(source) + copied, length,
                          cudaMemcpyDeviceToHost, stream),
          "copy to the host");
    copied += length;
    if (copied < bytes) {
      auto state = std::make_shared<Fence::State>();
      state->events.emplace_back(device, RecordNow(stream, "copy to the host"));
      prefixes.push_back({copied, Fence(std::move(state))});
    }
  } while (copied < bytes);
  return prefixes;
}

// Completes `staged` whose single host array was copied in pieces `prefixes`: the last piece is
// the whole array, passed with `staged.copied`.
void AddPieces(Staged& staged, std::vector<CopiedPrefix> prefixes) {
  if (prefixes.empty()) return;
  staged.pieces = std::move(prefixes);
  staged.pieces.push_back({staged.hosts[0].nbytes(), staged.copied});
}

}  // namespace

Staged StartToHost(const std::vector<Array>& arrays, size_t piece_bytes) {
  Staged staged;
  std::map<int, cudaStream_t> used;
  // Pieces only where one array crosses: Staged::pieces describes hosts[0].
  const size_t piece = arrays.size() == 1 ? piece_bytes : 0;
  std::vector<CopiedPrefix> prefixes;
  staged.copied = QueueCopies(used, "copy to the host", [&] {
    for (const Array& a : arrays) {
      if (!a.on_device()) {
        staged.hosts.push_back(a);
        continue;
      }
      // Kept in `staged` before any copy into it is queued, so that it outlives QueueCopies's
      // wait on an error.
      staged.hosts.push_back(PinnedLike(a));
      const Array host = staged.hosts.back();
      cudaStream_t stream = CopyStream(a.device());
      used[a.device()] = stream;
      // Freed in `stream`'s order, after the copy below.
      std::shared_ptr<void> snapshot = Snapshot(a, stream);
      DeviceGuard guard(a.device());
      prefixes = CopyToHost(host, snapshot.get(), a.device(), stream, piece);
    }
  });
  AddPieces(staged, std::move(prefixes));
  return staged;
}

namespace {

// The sum of `arrays` (device values of one layout) in a buffer of dtrain's on the first one's
// device, queued on `stream` (dtrain's stream there).
std::shared_ptr<void> SumOnDevice(const std::vector<Array>& arrays, cudaStream_t stream) {
  const Array& first = arrays[0];
  const int device = first.device();
  std::shared_ptr<void> sum = Snapshot(first, stream);
  for (size_t i = 1; i < arrays.size(); ++i) {
    const Array& a = arrays[i];
    RequireDevice(a, "a sum on the device");
    RequireSameLayout(first, a, "a sum on the device");
    std::shared_ptr<void> value = Snapshot(a, stream);
    DeviceGuard guard(device);
    std::shared_ptr<void> from = value;  // buffers on `stream`'s device are freed in its order
    if (a.device() != device) {
      from = DeviceBuffer(device, a.nbytes(), stream);
      Check(cudaMemcpyPeerAsync(from.get(), device, value.get(), a.device(), a.nbytes(), stream),
            "peer copy between devices");
      // The snapshot is freed on its own device's stream: make that one wait for the peer copy.
      cudaEvent_t copied = RecordNow(stream, "peer copy between devices");
      DeviceGuard peer(a.device());
      WaitOnEvent(CopyStream(a.device()), copied, "ordering a snapshot's release");
    }
    Check(LaunchAddInto(sum.get(), from.get(), first.size(), first.dtype(), stream),
          "sum on the device");
  }
  return sum;
}

// A pinned host array for what `encoder` makes.
Array PinnedFor(const DeviceEncoder& encoder) {
  return PinnedLike(Array::Wrap(nullptr, encoder.shape, encoder.dtype, nullptr));
}

// `encoder` run on `source` (a buffer of dtrain's on `device`, current) on `stream`, into a new
// buffer of `bytes` there. `source`'s buffer is freed in `stream`'s order, after the kernels that
// read it.
std::shared_ptr<void> Encoded(const DeviceEncoder& encoder, const std::shared_ptr<void>& source,
                              size_t bytes, int device, cudaStream_t stream) {
  std::shared_ptr<void> encoded = DeviceBuffer(device, bytes, stream);
  encoder.encode(source.get(), encoded.get(), stream);
  return encoded;
}

// Both StartSumToHost: the sum on the first array's device, encoded there where `encoder` is
// given, and copied to one pinned host array (in pieces of `piece_bytes`, if not 0).
Staged SumToHost(const std::vector<Array>& arrays, const DeviceEncoder* encoder,
                 size_t piece_bytes) {
  if (arrays.empty()) throw InvalidArgument("a sum of no values");
  RequireDevice(arrays[0], "a sum on the device");
  const int device = arrays[0].device();
  cudaStream_t stream = CopyStream(device);
  std::shared_ptr<void> source = SumOnDevice(arrays, stream);
  Array host = encoder == nullptr ? PinnedLike(arrays[0]) : PinnedFor(*encoder);
  DeviceGuard guard(device);
  if (encoder != nullptr) source = Encoded(*encoder, source, host.nbytes(), device, stream);
  std::map<int, cudaStream_t> used{{device, stream}};
  std::vector<CopiedPrefix> prefixes;
  const char* what =
      encoder == nullptr ? "copy of a sum to the host" : "copy of an encoded sum to the host";
  Staged staged{
      {host},
      QueueCopies(used, what,
                  [&] { prefixes = CopyToHost(host, source.get(), device, stream, piece_bytes); }),
      {}};
  AddPieces(staged, std::move(prefixes));
  return staged;
}

}  // namespace

Array StartSumOnDevice(const std::vector<Array>& arrays) {
  if (arrays.empty()) throw InvalidArgument("a sum of no values");
  RequireDevice(arrays[0], "a sum on the device");
  const int device = arrays[0].device();
  cudaStream_t stream = CopyStream(device);
  std::shared_ptr<void> sum = SumOnDevice(arrays, stream);
  return Array::WrapDevice(sum.get(), arrays[0].shape(), arrays[0].dtype(), device, stream, sum);
}

Staged StartSumToHost(const std::vector<Array>& arrays, size_t piece_bytes) {
  return SumToHost(arrays, nullptr, piece_bytes);
}

Staged StartSumToHost(const std::vector<Array>& arrays, const DeviceEncoder& encoder,
                      size_t piece_bytes) {
  return SumToHost(arrays, &encoder, piece_bytes);
}

Staged StartEachEncodedToHost(const std::vector<Array>& arrays,
                              const std::vector<DeviceEncoder>& encoders) {
  if (arrays.size() != encoders.size()) {
    throw InvalidArgument("values encoded on their devices: " + std::to_string(arrays.size()) +
                          " values, " + std::to_string(encoders.size()) + " encoders");
  }
  // What can be checked or made before any encoder runs (an encoder may change state on its device,
  // a residual, for a value that then never crosses if a later one fails): first.
  Staged staged;
  for (size_t i = 0; i < arrays.size(); ++i) {
    RequireDevice(arrays[i], "a value encoded on its device");
    staged.hosts.push_back(PinnedFor(encoders[i]));
  }
  std::map<int, cudaStream_t> used;
  staged.copied = QueueCopies(used, "copy of values encoded on their devices to the host", [&] {
    for (size_t i = 0; i < arrays.size(); ++i) {
      const Array& a = arrays[i];
      const Array& host = staged.hosts[i];
      cudaStream_t stream = CopyStream(a.device());
      used[a.device()] = stream;
      std::shared_ptr<void> snapshot = Snapshot(a, stream);
      DeviceGuard guard(a.device());
      std::shared_ptr<void> encoded =
          Encoded(encoders[i], snapshot, host.nbytes(), a.device(), stream);
      CopyToHost(host, encoded.get(), a.device(), stream, 0);
    }
  });
  return staged;
}

std::vector<Array> ToHost(const std::vector<Array>& arrays) {
  Staged staged = StartToHost(arrays);
  staged.copied.Wait("copy to the host");
  return staged.hosts;
}

Array ToHost(const Array& array) { return ToHost(std::vector<Array>{array})[0]; }

Fence StartCopyFromHost(const Array& host, const std::vector<Array>& devices) {
  return StartCopyFromHost(host, devices, 0, host.nbytes());
}

Fence StartCopyFromHost(const Array& host, const std::vector<Array>& devices, size_t begin,
                        size_t end) {
  host.RequireHost("CopyFromHost");
  if (begin > end || end > host.nbytes()) {
    throw InvalidArgument("copy from the host of bytes [" + std::to_string(begin) + ", " +
                          std::to_string(end) + ") of an array of " +
                          std::to_string(host.nbytes()));
  }
  std::map<int, cudaStream_t> used;
  return QueueCopies(used, "copy to the device", [&] {
    for (const Array& d : devices) {
      RequireSameLayout(host, d, "copy from the host");
      if (!d.on_device()) {
        std::memcpy(d.bytes() + begin, host.bytes() + begin, end - begin);
        continue;
      }
      cudaStream_t stream = CopyStream(d.device());
      used[d.device()] = stream;
      DeviceGuard guard(d.device());
      OrderAfterProducer(d, stream);  // the user's queued work may still read the old values
      Check(cudaMemcpyAsync(d.bytes() + begin, host.bytes() + begin, end - begin,
                            cudaMemcpyHostToDevice, stream),
            "copy to the device");
    }
  });
}

void CopyFromHost(const Array& host, const std::vector<Array>& devices) {
  StartCopyFromHost(host, devices).Wait("copy to the device");
}

void Copy(const Array& from, const std::vector<Array>& to) {
  bool any_on_device = false;
  for (const Array& t : to) {
    RequireSameLayout(from, t, "copy");
    any_on_device = any_on_device || t.on_device();
  }
  if (!from.on_device()) {
    if (!any_on_device) {
      // No stream involved: a plain copy (the local store's every pull, so nothing more).
      for (const Array& t : to) t.CopyFrom(from);
    } else {
      CopyFromHost(from, to);  // host targets get a plain copy there
    }
    return;
  }
  std::vector<Array> hosts, devices;
  for (const Array& t : to) (t.on_device() ? devices : hosts).push_back(t);
  if (!hosts.empty()) {
    const Array staged = ToHost(from);
    for (const Array& h : hosts) h.CopyFrom(staged);
  }
  auto stream = static_cast<cudaStream_t>(from.stream());
  for (const Array& d : devices) {
    WaitForProducer(d, stream, from.device());  // the user's queued work may read the old values
    {
      DeviceGuard guard(from.device());
      Check(cudaMemcpyPeerAsync(d.data(), d.device(), from.data(), from.device(), from.nbytes(),
                                stream),
            "copy between device arrays");
    }
    OrderAfter(from, d);  // the user's later work on d's stream sees the copy
  }
}

Fence AfterQueuedWork(const std::vector<Array>& arrays) {
  std::vector<std::pair<int, cudaStream_t>> streams;  // several arrays may share one
  for (const Array& a : arrays) {
    if (a.on_device()) streams.emplace_back(a.device(), static_cast<cudaStream_t>(a.stream()));
  }
  return FenceAfter(streams, "marking a stream's work");
}

Array NewOnDevice(int device, const Shape& shape, DType dtype, const void* values) {
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  DeviceGuard guard(device);
  void* p = nullptr;
  Check(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc");
  // cudaFree waits for the work on the device first, so no queued update still uses the memory.
  std::shared_ptr<void> memory(p, [device](void* q) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaFree(q);
    cudaSetDevice(previous);
  });
  cudaStream_t stream = FillStream(device);
  if (values == nullptr) {
    Check(cudaMemsetAsync(p, 0, bytes, stream), "zeroing device memory");
  } else {
    Check(cudaMemcpyAsync(p, values, bytes, cudaMemcpyHostToDevice, stream), "copy to the device");
  }
  WaitFor(stream, "filling new device memory");
  return Array::WrapDevice(p, shape, dtype, device, nullptr, std::move(memory));
}

Array ZerosForEncoders(int device, const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  cudaStream_t stream = CopyStream(device);
  auto memory = DeviceBuffer(device, bytes, stream);
  DeviceGuard guard(device);
  Check(cudaMemsetAsync(memory.get(), 0, bytes, stream), "zeroing device memory");
  return Array::WrapDevice(memory.get(), shape, dtype, device, stream, memory);
}

void OrderAfter(const Array& producer, const Array& consumer) {
  RequireDevice(producer, "OrderAfter");
  RequireDevice(consumer, "OrderAfter");
  if (producer.device() == consumer.device() && producer.stream() == consumer.stream()) return;
  // With the consumer's device current: a null consumer stream is its device's legacy stream.
  WaitForProducer(producer, static_cast<cudaStream_t>(consumer.stream()), consumer.device());
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

// CUDA in the core, without LibTorch: what dtrain does with values that live in GPU memory.
//
// An Array on a device (Array::WrapDevice) carries its device id and the stream its producer
// used. Everything here orders itself after the work already queued on that stream (an event
// recorded there, waited on by dtrain's own copy stream: no host synchronisation with the
// producer). The Start* calls return at once with a Fence; the others return once their own copies
// and kernels have finished, so the caller may hand the results to the network or back to the user
// at once. Those waits include the producer's queued work, so they are bounded by the job's
// DTRAIN_REQUEST_TIMEOUT_MS: past it, TimeoutError.
//
// Host copies go through page-locked (pinned) buffers from a pool (pinned_pool.h), so a round
// allocates nothing once warm and copies run at the bus's rate.
//
// Built without the CUDA toolkit, Built() is false, DeviceCount() is 0 and every other call throws
// InvalidArgument saying so; device Arrays cannot be made then (the front ends refuse CUDA
// tensors).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/common/array.h"

namespace dtrain::cuda {

// Compiled with the CUDA toolkit.
bool Built();
// CUDA devices this process can use: 0 when not built, without a driver or without a GPU.
int DeviceCount();
// Why DeviceCount() is 0, for skip messages and errors ("" when it is not).
std::string Unavailable();

// A pinned host array of `like`'s shape and dtype; its contents are undefined.
Array PinnedLike(const Array& like);
// Copies and kernels queued on dtrain's streams that the caller has not waited for yet. Wait()
// returns once they have finished; it is bounded by the job's DTRAIN_REQUEST_TIMEOUT_MS
// (TimeoutError naming `what`). A default Fence has passed. Copies share state; thread-safe.
class Fence {
 public:
  struct State;
  Fence() = default;
  explicit Fence(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void Wait(const std::string& what) const;

 private:
  std::shared_ptr<State> state_;
};

// The first `bytes` bytes of a host array being copied from a device: there once `copied` has
// passed.
struct CopiedPrefix {
  size_t bytes = 0;
  Fence copied;
};

// Host arrays whose values are being copied from a device: read them once `copied` has passed.
// Where one host array was copied in pieces (the `piece_bytes` below), `pieces` holds its growing
// prefixes, the last one the whole array, so that the caller may send the first bytes while the
// later ones are still on their way; otherwise it is empty.
struct Staged {
  std::vector<Array> hosts;
  Fence copied;
  std::vector<CopiedPrefix> pieces;
};

// Starts copying device arrays into pinned host arrays (same shape and dtype) and returns without
// waiting for the copies, so that the caller (autograd's hook) does not stall the GPU's queue.
// Each device value is first copied on its producer's own stream into a device buffer of dtrain's,
// a copy at the GPU's memory rate, so the producer's later work may overwrite or free it at once;
// the copy to the host then runs on dtrain's stream. Host arrays among `arrays` are returned as
// they are. A single device value bigger than a non-zero `piece_bytes` is copied in pieces of that
// size, each marked (Staged::pieces).
Staged StartToHost(const std::vector<Array>& arrays, size_t piece_bytes = 0);
// The same for several device values of one layout (MXNet's *_device stores): summed on the first
// one's device (peer copies for values on other devices), and only the sum copied (one host array,
// in pieces as above).
Staged StartSumToHost(const std::vector<Array>& arrays, size_t piece_bytes = 0);
// What a device value becomes before it crosses to the host (gradient compression, say): an array
// of `shape` and `dtype` that `encode(value, out, stream)` writes. It queues its kernels on
// `stream` (a cudaStream_t of the value's device, current when it is called), reading `value` and
// writing `out`, both in that device's memory, and does not wait for them.
struct DeviceEncoder {
  Shape shape;
  DType dtype = DType::kFloat32;
  std::function<void(const void* value, void* out, void* stream)> encode;
};
// StartSumToHost with the sum encoded on its device: only the encoded array crosses, into one
// pinned host array. A single value is encoded as it is (a snapshot of it, as above). Work on one
// device's values runs in the order of the calls (one stream per device), so an encoder may keep
// state on the device from one call to the next. The encoded array is copied in pieces as above.
Staged StartSumToHost(const std::vector<Array>& arrays, const DeviceEncoder& encoder,
                      size_t piece_bytes = 0);
// StartToHost with each value encoded on its own device first, by the encoder of its index (as
// MXNet's device store compresses each GPU's gradient on that GPU): only the encoded arrays
// cross, one pinned host array each (encoders[i]'s shape and dtype). Every array must be on a
// device; `encoders` has one per array. The encoders of one device run on dtrain's stream there,
// in the order of the calls, so each may keep state on its device as above.
Staged StartEachEncodedToHost(const std::vector<Array>& arrays,
                              const std::vector<DeviceEncoder>& encoders);
// The sum of `arrays` (device values of one layout; a single one is copied) in a buffer of
// dtrain's on the first one's device, for work that stays there (an optimizer's update on the
// GPU, or a local store's value kept there): queued on dtrain's stream of that device and not
// waited for. The returned Array names that stream, so only work queued there or ordered after it
// (OrderAfter) may read it; its memory goes back in that stream's order. As with StartToHost, each
// value is copied on its producer's stream first, so the producer may overwrite it at once.
Array StartSumOnDevice(const std::vector<Array>& arrays);
// Copies `from` into every array of `to` (same size and dtype), wherever each lives. Into a device
// array from a device: queued on `from`'s stream after the work queued so far on the target's
// stream (which may still read its old values), and the target's stream waits for the copy, so the
// user's later work there sees it; no host wait. Work queued later on `from`'s stream (the next
// update of a weight) comes after the copy. Into the host from a device, and from the host into a
// device: waited for, as ToHost and CopyFromHost. Host to host: a plain copy.
void Copy(const Array& from, const std::vector<Array>& to);
// A fence passed once the work queued so far on the streams of `arrays`' device arrays (the
// stream each names) has finished; host arrays have none.
Fence AfterQueuedWork(const std::vector<Array>& arrays);
// Starts copying `host` into each device array of `devices`, after the work queued on its stream
// (host ones get a plain copy at once). `host` must stay as it is until the fence has passed.
Fence StartCopyFromHost(const Array& host, const std::vector<Array>& devices);
// The same for bytes [begin, end) of `host` only, into the same bytes of each array of `devices`
// (a part of a pulled value that has arrived while the rest is still on the network).
Fence StartCopyFromHost(const Array& host, const std::vector<Array>& devices, size_t begin,
                        size_t end);

// The same, waited for: copies of device arrays into pinned host arrays, and of a host array into
// device arrays. Sizes and dtypes must match.
std::vector<Array> ToHost(const std::vector<Array>& arrays);
Array ToHost(const Array& array);
void CopyFromHost(const Array& host, const std::vector<Array>& devices);

// A new array of `shape` and `dtype` in the memory of `device`, holding a copy of the host bytes
// `values` (zeros where null), ready when this returns (filled on a stream of its own, so the wait
// is for that copy only, never for the users' work that other copies wait for). Its memory is its
// own (not from a stream's pool), for values that live long, as an optimizer's state does; the
// returned Array names the default stream as its producer.
Array NewOnDevice(int device, const Shape& shape, DType dtype, const void* values);
// A new array of zeros in the memory of `device`, for state that a DeviceEncoder keeps from one
// call to the next (a residual): its zeroing is queued on dtrain's stream there and not waited
// for, so only work queued on that stream afterwards (encoders run there) may use it.
Array ZerosForEncoders(int device, const Shape& shape, DType dtype);
// Makes the work queued later on `consumer`'s stream wait for the work queued so far on
// `producer`'s (an event; no host wait). Nothing to do when they share a stream.
void OrderAfter(const Array& producer, const Array& consumer);

// A new array in device memory of `like`'s device, holding a copy of `like`.
Array CloneOnDevice(const Array& like);
// dst += src elementwise on dst's device; src may be on another device (copied there first).
// float16 and bfloat16 are summed through float32 and rounded once, as the host's AddInto does.
void AddInto(const Array& dst, const Array& src);

}  // namespace dtrain::cuda

// CUDA in the core, without LibTorch: what dtrain does with values that live in GPU memory.
//
// An Array on a device (Array::WrapDevice) carries its device id and the stream its producer
// used. Everything here orders itself after the work already queued on that stream (an event
// recorded there, waited on by dtrain's own copy stream: no host synchronisation with the
// producer), and returns once its own copies and kernels have finished, so the caller may hand the
// results to the network or back to the user at once. Those waits include the producer's queued
// work, so they are bounded by the job's DTRAIN_REQUEST_TIMEOUT_MS: past it, TimeoutError.
//
// Host copies go through page-locked (pinned) buffers from a pool (pinned_pool.h), so a round
// allocates nothing once warm and copies run at the bus's rate.
//
// Built without the CUDA toolkit, Built() is false, DeviceCount() is 0 and every other call throws
// InvalidArgument saying so; device Arrays cannot be made then (the front ends refuse CUDA
// tensors).
#pragma once

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
// Copies of device arrays into pinned host arrays (same shape and dtype), all queued before one
// wait. Host arrays among `arrays` are returned as they are.
std::vector<Array> ToHost(const std::vector<Array>& arrays);
Array ToHost(const Array& array);
// Copies `host` into each device array of `devices` (host ones get a plain copy). Sizes and dtypes
// must match.
void CopyFromHost(const Array& host, const std::vector<Array>& devices);

// A new array in device memory of `like`'s device, holding a copy of `like`.
Array CloneOnDevice(const Array& like);
// dst += src elementwise on dst's device; src may be on another device (copied there first).
// float16 and bfloat16 are summed through float32 and rounded once, as the host's AddInto does.
void AddInto(const Array& dst, const Array& src);

}  // namespace dtrain::cuda

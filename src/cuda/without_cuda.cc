// cuda.h in a build without the CUDA toolkit: nothing can be on a device.
#include <cstring>

#include "cuda/cuda.h"
#include "dtrain/common/error.h"

namespace dtrain::cuda {
namespace {

[[noreturn]] void NotBuilt() {
  throw InvalidArgument(
      "dtrain was built without CUDA (no nvcc was found when it was built): CUDA arrays cannot "
      "be moved; rebuild where the CUDA toolkit is installed, or pass host (CPU) values");
}

}  // namespace

bool Built() { return false; }
int DeviceCount() { return 0; }
std::string Unavailable() { return "dtrain was built without CUDA"; }
Array PinnedLike(const Array&) { NotBuilt(); }
struct Fence::State {};
void Fence::Wait(const std::string&) const {}
std::vector<Array> ToHost(const std::vector<Array>& arrays) {
  for (const Array& a : arrays) {
    if (a.on_device()) NotBuilt();
  }
  return arrays;
}
Array ToHost(const Array& array) { return ToHost(std::vector<Array>{array})[0]; }
Staged StartToHost(const std::vector<Array>& arrays, size_t) {
  return {ToHost(arrays), Fence(), {}};
}
Staged StartSumToHost(const std::vector<Array>& arrays, size_t) { return StartToHost(arrays, 0); }
Staged StartSumToHost(const std::vector<Array>& arrays, const DeviceEncoder&, size_t) {
  for (const Array& a : arrays) {
    if (a.on_device()) NotBuilt();
  }
  throw InvalidArgument("an encoded sum on a device, of host values");
}
Staged StartEachEncodedToHost(const std::vector<Array>& arrays, const std::vector<DeviceEncoder>&) {
  for (const Array& a : arrays) {
    if (a.on_device()) NotBuilt();
  }
  throw InvalidArgument("values encoded on their devices, of host values");
}
void CopyFromHost(const Array& host, const std::vector<Array>& devices) {
  for (const Array& d : devices) {
    if (d.on_device()) NotBuilt();
    d.CopyFrom(host);
  }
}
Fence StartCopyFromHost(const Array& host, const std::vector<Array>& devices) {
  CopyFromHost(host, devices);
  return Fence();
}
Fence StartCopyFromHost(const Array& host, const std::vector<Array>& devices, size_t begin,
                        size_t end) {
  host.RequireHost("CopyFromHost");
  for (const Array& d : devices) {
    if (d.on_device()) NotBuilt();
    if (d.size() != host.size() || d.dtype() != host.dtype()) {
      throw InvalidArgument("copy from the host between arrays of different layouts");
    }
  }
  if (begin > end || end > host.nbytes()) throw InvalidArgument("copy of bytes past the array");
  for (const Array& d : devices) std::memcpy(d.bytes() + begin, host.bytes() + begin, end - begin);
  return Fence();
}
Array StartSumOnDevice(const std::vector<Array>&) { NotBuilt(); }
void Copy(const Array& from, const std::vector<Array>& to) {
  if (from.on_device()) NotBuilt();
  for (const Array& t : to) {
    if (t.on_device()) NotBuilt();
    t.CopyFrom(from);
  }
}
Fence AfterQueuedWork(const std::vector<Array>& arrays) {
  for (const Array& a : arrays) {
    if (a.on_device()) NotBuilt();
  }
  return Fence();
}
Array NewOnDevice(int, const Shape&, DType, const void*) { NotBuilt(); }
Array ZerosForEncoders(int, const Shape&, DType) { NotBuilt(); }
void OrderAfter(const Array&, const Array&) { NotBuilt(); }
Array CloneOnDevice(const Array&) { NotBuilt(); }
void AddInto(const Array&, const Array&) { NotBuilt(); }

}  // namespace dtrain::cuda

// device_codec.h in a build without the CUDA toolkit: no value can be on a device.
#include "compression/kernels/device_codec.h"
#include "dtrain/common/error.h"

namespace dtrain {

void CompressOnDevice(const CompressionSpec&, const float*, float*, int64_t, void*, int, void*) {
  throw InvalidArgument(
      "dtrain was built without CUDA (no nvcc was found when it was built): gradients cannot be "
      "compressed on a device");
}

}  // namespace dtrain

// device_launch.h in a build without the CUDA toolkit: no value can be on a device, so no update
// can be launched there.
#include "dtrain/common/error.h"
#include "optim/kernels/device_launch.h"

namespace dtrain::kernels {
namespace {

[[noreturn]] void NotBuilt() {
  throw InvalidArgument(
      "dtrain was built without CUDA (no nvcc was found when it was built): the optimizer cannot "
      "update values on a device");
}

}  // namespace

void LaunchSgd(const SgdRates&, SgdKind, bool, const DeviceTarget&) { NotBuilt(); }
void LaunchAdam(const AdamRates&, bool, const DeviceTarget&) { NotBuilt(); }
void LaunchAdaGrad(const AdaGradRates&, bool, const DeviceTarget&) { NotBuilt(); }
void LaunchRMSProp(const RMSPropRates&, bool, bool, bool, const DeviceTarget&) { NotBuilt(); }

}  // namespace dtrain::kernels

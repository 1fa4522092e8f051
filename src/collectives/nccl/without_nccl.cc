// device_communicator.h where NCCL was not found at build time: CUDA tensors are reduced through
// host memory instead (collectives.h, GpuOperations).
#include "collectives/nccl/device_communicator.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {

bool NcclBuilt() { return false; }
int NcclVersion() { return 0; }

std::unique_ptr<DeviceCommunicator> CreateNcclCommunicator(std::shared_ptr<Communicator>, int,
                                                           Duration, const std::atomic<bool>&,
                                                           bool) {
  throw InvalidArgument(
      "this dtrain was built without NCCL (no nccl.h and libnccl were found with the CUDA "
      "toolkit or PyTorch's nvidia packages): CUDA tensors are reduced through host memory; set "
      "HOROVOD_GPU_OPERATIONS=GLOO, or rebuild where NCCL is installed");
}

}  // namespace dtrain::collectives

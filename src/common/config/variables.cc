#include "common/config/variables.h"

#include <algorithm>
#include <array>

namespace dtrain {
namespace {

constexpr std::array kVariables = {
    // the job's layout (MXNet's names)
    Variable{"DMLC_ROLE"},
    Variable{"DMLC_PS_ROOT_URI"},
    Variable{"DMLC_PS_ROOT_PORT"},
    Variable{"DMLC_NUM_SERVER"},
    Variable{"DMLC_NUM_WORKER"},
    Variable{"DMLC_INTERFACE"},
    Variable{"DMLC_NODE_HOST"},
    Variable{"DMLC_NODE_PORT"},
    Variable{"DTRAIN_NODE_RANK", true},
    Variable{"DTRAIN_LOCAL_WORKERS", true},  // `import dtrain`'s threads; the KVStore's waits
    // Kubernetes's: in a pod, the connect and start deadlines wait for pods (config.cc)
    Variable{"KUBERNETES_SERVICE_HOST", true},
    Variable{"DMLC_USE_KUBERNETES", true},
    Variable{"MX_CONFIG", true},  // MXJob's JSON (operator_env.h)
    // PyTorchJob's and torchrun's (operator_env.h)
    Variable{"MASTER_ADDR", true},
    Variable{"MASTER_PORT", true},
    Variable{"WORLD_SIZE", true},
    Variable{"RANK", true},
    // ps-lite's
    Variable{"PS_VERBOSE"},
    Variable{"PS_RESEND"},
    Variable{"PS_RESEND_TIMEOUT"},
    Variable{"PS_HEARTBEAT_INTERVAL"},
    Variable{"PS_HEARTBEAT_TIMEOUT"},
    // MXNet's kvstore
    Variable{"MXNET_KVSTORE_BIGARRAY_BOUND"},
    Variable{"MXNET_KVSTORE_REDUCTION_NTHREADS"},
    // dtrain's: deadlines, transport
    Variable{"DTRAIN_CONNECT_TIMEOUT_MS"},
    Variable{"DTRAIN_HELLO_TIMEOUT_MS"},
    Variable{"DTRAIN_LINK_TIMEOUT_MS"},
    Variable{"DTRAIN_RESEND_WINDOW_MS"},
    Variable{"DTRAIN_START_TIMEOUT_MS"},
    Variable{"DTRAIN_REQUEST_TIMEOUT_MS"},
    Variable{"DTRAIN_FAILURE_EXIT_MS"},
    Variable{"DTRAIN_RESTART_WAIT_MS"},
    Variable{"DTRAIN_RESTART_COUNT", true},
    Variable{"DTRAIN_CHECKPOINT_DIR"},
    Variable{"DTRAIN_SERVER_CHECKPOINT_S"},
    Variable{"DTRAIN_REPLAY_LOG_MB"},
    Variable{"DTRAIN_STREAMS_PER_PEER"},
    Variable{"DTRAIN_IO_THREADS"},
    Variable{"DTRAIN_APPLY_THREADS"},
    Variable{"DTRAIN_CHUNK_BYTES"},
    Variable{"DTRAIN_PARTITION_BYTES"},
    Variable{"DTRAIN_TCP_NOTSENT_LOWAT"},
    Variable{"DTRAIN_TCP_SNDBUF"},
    Variable{"DTRAIN_TCP_LOCAL_CONGESTION"},
    Variable{"DTRAIN_SAME_HOST"},
    Variable{"DTRAIN_MAX_MESSAGE_BYTES"},
    Variable{"DTRAIN_JOB_SECRET"},
    // the worker process
    Variable{"DTRAIN_KEEP_FREED_MB"},
    // the `dtrain` command (the `pip install`ed entry point sets it to its own interpreter)
    Variable{"DTRAIN_PYTHON"},
    // allreduce mode (Horovod's names as fallbacks)
    Variable{"DTRAIN_COLLECTIVES"},
    Variable{"OMPI_COMM_WORLD_SIZE", true},
    Variable{"OMPI_COMM_WORLD_LOCAL_SIZE", true},
    Variable{"HOROVOD_LOCAL_SIZE", true},
    Variable{"LOCAL_WORLD_SIZE", true},
    Variable{"OMPI_MCA_mpi_yield_when_idle"},
    Variable{"DTRAIN_FUSION_THRESHOLD_MB"},
    Variable{"HOROVOD_FUSION_THRESHOLD"},
    Variable{"DTRAIN_CYCLE_TIME_MS"},
    Variable{"HOROVOD_CYCLE_TIME"},
    Variable{"DTRAIN_STALL_WARNING_S"},
    Variable{"HOROVOD_STALL_CHECK_TIME_SECONDS"},
    Variable{"DTRAIN_COLLECTIVE_TIMEOUT_MS"},
    Variable{"DTRAIN_DEADLOCK_MS"},
    Variable{"DTRAIN_SPIN_WAIT_US"},
    Variable{"DTRAIN_OVERLAP_GRADIENTS"},  // read by dtrain.torch's DistributedOptimizer
    Variable{"DTRAIN_FP16_ALLREDUCE"},
    Variable{"HOROVOD_AUTOTUNE"},
    Variable{"HOROVOD_AUTOTUNE_LOG"},
    Variable{"HOROVOD_AUTOTUNE_WARMUP_SAMPLES"},
    Variable{"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"},
    Variable{"DTRAIN_GLOO_FILE_STORE"},
    Variable{"DTRAIN_GLOO_ALGORITHM"},
    Variable{"DTRAIN_GLOO_SHM"},
    Variable{"DTRAIN_MPI_RING_BYTES"},
    Variable{"DTRAIN_ELASTIC", true},
    Variable{"DTRAIN_ELASTIC_TIMEOUT_S", true},
    Variable{"HOROVOD_GPU_OPERATIONS"},
    Variable{"HOROVOD_HIERARCHICAL_ALLREDUCE"},
    // what a process tells its launcher
    Variable{"DTRAIN_TIMELINE"},
    Variable{"HOROVOD_TIMELINE"},
    Variable{"DTRAIN_REPORT_ADDR", true},
    Variable{"DTRAIN_REPORT_TOKEN", true},
};

}  // namespace

std::span<const Variable> Variables() { return kVariables; }

bool IsKnownVariable(std::string_view name) {
  return std::any_of(kVariables.begin(), kVariables.end(),
                     [name](const Variable& v) { return v.name == name; });
}

}  // namespace dtrain

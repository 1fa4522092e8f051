#include "collectives/config.h"

#include <sstream>

#include "collectives/nccl/device_communicator.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

void CheckGlooLayout(const Config& config, CollectivesConfig* c) {
  const bool has_rank = config.requested_rank >= 0;
  const bool has_size = config.num_workers > 0;
  if (!has_rank && !has_size) {
    // A script started by hand, outside any launcher: a job of one.
    c->rank = 0;
    c->size = 1;
  } else if (!has_rank || !has_size) {
    throw ConfigError(std::string(has_rank ? "DMLC_NUM_WORKER" : "DTRAIN_NODE_RANK") +
                      " is not set (DTRAIN_COLLECTIVES=gloo needs DTRAIN_NODE_RANK and "
                      "DMLC_NUM_WORKER; start the job with `dtrain launch -s 0` or mpirun)");
  } else {
    c->rank = config.requested_rank;
    c->size = config.num_workers;
  }
  if (c->rank >= c->size) {
    throw ConfigError("DTRAIN_NODE_RANK=" + std::to_string(c->rank) +
                      " is not below DMLC_NUM_WORKER=" + std::to_string(c->size));
  }
  const bool tcp = !c->rendezvous_host.empty() && c->rendezvous_port != 0;
  if (c->size > 1 && c->file_store_dir.empty() && !tcp) {
    throw ConfigError(
        std::string(c->rendezvous_host.empty() ? "DMLC_PS_ROOT_URI" : "DMLC_PS_ROOT_PORT") +
        " is not set: a gloo job of " + std::to_string(c->size) +
        " workers needs a rendezvous, DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT (rank 0 listens "
        "there) or DTRAIN_GLOO_FILE_STORE (a directory every worker shares)");
  }
}

}  // namespace

const char* BackendName(BackendKind kind) { return kind == BackendKind::kMpi ? "mpi" : "gloo"; }

CollectivesConfig CollectivesConfig::FromConfig(const Config& config) {
  const AllreduceSettings& a = config.allreduce;
  CollectivesConfig c;
  if (a.backend.empty()) {
    c.backend = a.under_mpirun ? BackendKind::kMpi : BackendKind::kGloo;
  } else {
    c.backend = a.backend == "mpi" ? BackendKind::kMpi : BackendKind::kGloo;
  }
  c.rendezvous_host = config.scheduler_host;
  c.rendezvous_port = config.scheduler_port;
  c.file_store_dir = a.gloo_file_store;
  c.interface = config.interface;
  c.node_host = config.node_host;
  c.gloo_algorithm = a.gloo_algorithm;
  c.shared_memory = a.gloo_shared_memory;
  c.mpi_ring_bytes = a.mpi_ring_bytes;
  c.elastic = a.elastic;
  c.elastic_timeout = a.elastic_timeout;
  c.report_address = config.report_address;
  c.report_token = config.report_token;
  if (c.elastic) {
    if (c.backend != BackendKind::kGloo || c.report_address.empty()) {
      throw ConfigError(
          "DTRAIN_ELASTIC=1 needs the gloo backend and the launcher that assigns the ranks: start "
          "the job with `dtrain launch -s 0 --host-discovery-script SCRIPT`");
    }
  } else if (c.backend == BackendKind::kGloo) {
    CheckGlooLayout(config, &c);
  }
  if (a.gpu_operations == "nccl" && !NcclBuilt()) {
    throw ConfigError(
        "HOROVOD_GPU_OPERATIONS=NCCL, but this dtrain was built without NCCL (no nccl.h and "
        "libnccl were found with the CUDA toolkit or PyTorch's nvidia packages); unset it to "
        "reduce CUDA tensors through host memory");
  }
  c.nccl = a.gpu_operations.empty() ? NcclBuilt() : a.gpu_operations == "nccl";
  c.nccl_hierarchical = c.nccl && a.hierarchical_allreduce;
  c.job_secret = config.job_secret;
  static_cast<CollectiveTuning&>(c) = a.tuning;
  c.connect_timeout = config.connect_timeout;
  c.heartbeat_interval = config.heartbeat_interval;
  c.heartbeat_timeout = config.heartbeat_timeout;
  c.verbose = config.verbose;
  return c;
}

CollectivesConfig CollectivesConfig::FromEnvironment(const EnvLookup& env) {
  return FromConfig(Config::FromEnvironment(env));
}

std::string CollectivesConfig::Describe() const {
  std::ostringstream out;
  out << "DTRAIN_COLLECTIVES=" << BackendName(backend);
  if (backend == BackendKind::kGloo) {
    out << " DTRAIN_NODE_RANK=" << rank << " DMLC_NUM_WORKER=" << size
        << " DMLC_PS_ROOT_URI=" << rendezvous_host << " DMLC_PS_ROOT_PORT=" << rendezvous_port
        << " DTRAIN_GLOO_FILE_STORE=" << file_store_dir
        << " DMLC_INTERFACE=" << interface << " DMLC_NODE_HOST=" << node_host
        << " DTRAIN_GLOO_ALGORITHM=" << gloo_algorithm << " DTRAIN_GLOO_SHM=" << shared_memory;
  } else {
    out << " DTRAIN_GLOO_SHM=" << shared_memory << " DTRAIN_MPI_RING_BYTES=" << mpi_ring_bytes;
  }
  out << " DTRAIN_FUSION_THRESHOLD_BYTES=" << fusion_threshold_bytes
      << " DTRAIN_CYCLE_TIME_MS=" << static_cast<double>(cycle_time.count()) / 1000.0
      << " DTRAIN_STALL_WARNING_S=" << stall_warning.count() / 1000
      << " DTRAIN_COLLECTIVE_TIMEOUT_MS=" << collective_timeout.count()
      << " DTRAIN_DEADLOCK_MS=" << deadlock_grace.count()
      << " DTRAIN_SPIN_WAIT_US=" << spin_wait.count()
      << " DTRAIN_CONNECT_TIMEOUT_MS=" << connect_timeout.count()
      << " DTRAIN_FP16_ALLREDUCE=" << fp16_allreduce << " HOROVOD_AUTOTUNE=" << autotune
      << " HOROVOD_GPU_OPERATIONS=" << (nccl ? "NCCL" : "host staging")
      << " HOROVOD_HIERARCHICAL_ALLREDUCE=" << nccl_hierarchical;
  return out.str();
}

}  // namespace dtrain::collectives

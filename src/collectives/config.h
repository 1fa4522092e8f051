// CollectivesConfig: what the allreduce mode needs of the job's one Config (common/config/config.h,
// which reads every variable), with the Gloo layout checked: a rank below the size, and a
// rendezvous for a job of more than one rank.
//
// The variables are listed in collectives.h. Horovod's names are accepted as fallbacks so that a
// Horovod job script runs unchanged; the DTRAIN_* name wins when both are set. A missing or
// malformed value is a ConfigError naming the variable and the value.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config/config.h"
#include "dtrain/collectives/collectives.h"
#include "dtrain/common/deadline.h"

namespace dtrain::collectives {

struct CollectivesConfig : CollectiveTuning {
  BackendKind backend = BackendKind::kGloo;  // DTRAIN_COLLECTIVES

  // --- gloo layout (ignored under MPI, which knows its own) ---
  int rank = -1;                 // DTRAIN_NODE_RANK
  int size = 0;                  // DMLC_NUM_WORKER
  std::string rendezvous_host;   // DMLC_PS_ROOT_URI: rank 0 hosts the rendezvous store here
  uint16_t rendezvous_port = 0;  // DMLC_PS_ROOT_PORT
  std::string file_store_dir;    // DTRAIN_GLOO_FILE_STORE: rendezvous through a shared directory
  std::string interface;         // DMLC_INTERFACE: gloo binds and announces this interface
  std::string node_host;         // DMLC_NODE_HOST: gloo binds and announces exactly this address
  // DTRAIN_GLOO_ALGORITHM: auto | ring | ring_chunked | halving_doubling | bcube; empty = auto,
  // chosen by measurement (gloo/gloo_backend_allreduce.cc). For benchmarks and tests.
  std::string gloo_algorithm;
  // DTRAIN_GLOO_SHM: ranks of one host exchange through a shared memory segment instead of gloo's
  // loopback TCP, and with several hosts the collectives go through one leader per host
  // (host_groups.h). Not with an explicit DTRAIN_GLOO_ALGORITHM, which asks for gloo's. Under MPI:
  // when every rank shares one host, they exchange through such a segment instead of MPI.
  bool shared_memory = true;
  // DTRAIN_MPI_RING_BYTES: under MPI, the smallest allreduce across hosts that goes around
  // dtrain's own ring of MPI point-to-point messages (mpi/mpi_ring.h) instead of MPI_Allreduce;
  // 0: none does.
  size_t mpi_ring_bytes = size_t{1} << 20;
  // DTRAIN_JOB_SECRET: the rendezvous store's connections authenticate with it (auth/job_auth.h).
  // Never printed.
  std::string job_secret;

  // DTRAIN_ELASTIC: an elastic job's worker; rank, size and the rendezvous come from the launcher
  // (elastic/elastic_membership.h) at Init, not from the layout variables.
  bool elastic = false;
  Duration elastic_timeout{600000};  // DTRAIN_ELASTIC_TIMEOUT_S
  std::string report_address;        // DTRAIN_REPORT_ADDR: where the launcher listens
  std::string report_token;          // DTRAIN_REPORT_TOKEN

  // HOROVOD_GPU_OPERATIONS: CUDA arrays go over NCCL (NCCL, the default where NCCL was built);
  // with GLOO or MPI the front ends copy them to host memory and the backend reduces them there.
  bool nccl = false;
  // HOROVOD_HIERARCHICAL_ALLREDUCE: NCCL allreduces reduce within each host over NCCL, across
  // hosts over this backend in host memory, and gather back within each host (nccl/hierarchy.h).
  bool nccl_hierarchical = false;

  // --- engine: the tuning above (CollectiveTuning), and ---
  Duration connect_timeout{30000};  // DTRAIN_CONNECT_TIMEOUT_MS: rendezvous
  // Liveness through the rendezvous connection: every rank sends a heartbeat each interval, and
  // rank 0 counts a rank silent for longer than the timeout as lost (a frozen or cut-off process
  // keeps its sockets open, so only silence shows it).
  Duration heartbeat_interval{1000};  // PS_HEARTBEAT_INTERVAL
  Duration heartbeat_timeout{15000};  // PS_HEARTBEAT_TIMEOUT
  int verbose = 0;                    // PS_VERBOSE

  // The allreduce mode's view of `config`. Throws ConfigError.
  static CollectivesConfig FromConfig(const Config& config);
  // FromConfig(Config::FromEnvironment(env)).
  static CollectivesConfig FromEnvironment(const EnvLookup& env = ProcessEnvironment());

  // "name=value" pairs of the values in effect, for PS_VERBOSE=1.
  std::string Describe() const;
};

const char* BackendName(BackendKind kind);

}  // namespace dtrain::collectives

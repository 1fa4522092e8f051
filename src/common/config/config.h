// The job configuration, read once from the environment.
//
// Every variable dtrain understands is read here and nowhere else (through EnvReader's one
// grammar, common/config/env_reader.h; the table of names is common/config/variables.cc),
// validated, and kept typed. The names are the ones MXNet, ps-lite and Horovod users already set
// (DMLC_*, PS_*, MXNET_KVSTORE_*, HOROVOD_*), plus DTRAIN_* for what they lack (deadlines, streams
// per peer). A missing or malformed variable is a ConfigError whose message names the variable and
// the value it had. Modules take what they need from a Config (collectives/config.h derives the
// allreduce mode's view from one) instead of reading the environment again.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "common/config/env_reader.h"
#include "dtrain/common/deadline.h"

namespace dtrain {

enum class Role { kScheduler, kServer, kWorker };

const char* RoleName(Role role);
// "scheduler", "server", "worker" -> the role; nullopt for anything else.
std::optional<Role> RoleFromName(const std::string& name);

// The shortest DTRAIN_JOB_SECRET accepted (characters).
constexpr size_t kMinSecretChars = 16;

// The job secret from DTRAIN_JOB_SECRET's value (unset or empty: none, ""). Throws ConfigError if
// it is shorter than kMinSecretChars; the message never quotes the value (it may reach a shared
// log).
std::string JobSecretFromVariable(const std::optional<std::string>& value);

// The job secret from the environment: JobSecretFromVariable on DTRAIN_JOB_SECRET as set ("" kept,
// and refused). For Config and for `dtrain launch`, which checks it before anything starts.
std::string JobSecretFromEnvironment(const EnvReader& r);

// DTRAIN_TIMELINE, else HOROVOD_TIMELINE ("" when neither is set: off). The one rule, for Config
// and for `dtrain launch`, which merges what the processes write where they write it.
std::string TimelinePathFromEnvironment(const EnvReader& r);

// DTRAIN_KEEP_FREED_MB in bytes, when set: the one parse, for Config and for the worker's heap
// setting at import (common/malloc_tuning.h), which runs before any Config. Throws ConfigError.
std::optional<size_t> KeepFreedBytesFromEnvironment(const EnvReader& r);

// The allreduce engine's tuning (collectives/config.h's CollectivesConfig is one of these too, so
// the defaults live here only).
struct CollectiveTuning {
  // DTRAIN_FUSION_THRESHOLD_MB, else HOROVOD_FUSION_THRESHOLD (bytes); 0: no fusion.
  size_t fusion_threshold_bytes = size_t{64} << 20;
  // DTRAIN_CYCLE_TIME_MS, else HOROVOD_CYCLE_TIME (decimal milliseconds).
  std::chrono::microseconds cycle_time{1000};
  // DTRAIN_STALL_WARNING_S, else HOROVOD_STALL_CHECK_TIME_SECONDS; 0: no warnings.
  Duration stall_warning{60000};
  Duration collective_timeout{600000};  // DTRAIN_COLLECTIVE_TIMEOUT_MS
  // DTRAIN_DEADLOCK_MS: how long every rank may wait, each for a collective another rank has not
  // submitted, with nothing submitted or run meanwhile, before those collectives fail as a
  // deadlock (engine.cc); 0: only the collective timeout ends such a wait.
  Duration deadlock_grace{10000};
  // DTRAIN_SPIN_WAIT_US: how long a thread waiting for a collective polls (yielding its core)
  // before it sleeps, where this host has a core for each of its ranks (engine.h); 0: it sleeps
  // at once.
  std::chrono::microseconds spin_wait{1000};
  bool fp16_allreduce = false;  // DTRAIN_FP16_ALLREDUCE
  // HOROVOD_AUTOTUNE: rank 0 tunes the fusion threshold and cycle time online
  // (collectives/engine/autotune.h), from these samples, logging each to HOROVOD_AUTOTUNE_LOG.
  bool autotune = false;
  int autotune_warmup_samples = 3;     // HOROVOD_AUTOTUNE_WARMUP_SAMPLES
  int autotune_steps_per_sample = 10;  // HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE
  std::string autotune_log;            // HOROVOD_AUTOTUNE_LOG
};

// The allreduce mode's variables, as read (collectives/config.h checks the layout it needs).
struct AllreduceSettings {
  std::string backend;             // DTRAIN_COLLECTIVES: "mpi", "gloo" or "" (unset)
  bool under_mpirun = false;       // OMPI_COMM_WORLD_SIZE is set: mpirun started this process
  std::string gloo_file_store;     // DTRAIN_GLOO_FILE_STORE
  std::string gloo_algorithm;      // DTRAIN_GLOO_ALGORITHM ("" = auto)
  bool gloo_shared_memory = true;  // DTRAIN_GLOO_SHM
  // DTRAIN_MPI_RING_BYTES: under MPI, an allreduce across hosts of at least this many bytes goes
  // around dtrain's segmented ring over MPI point-to-point (mpi/mpi_ring.h); 0: MPI_Allreduce.
  size_t mpi_ring_bytes = size_t{1} << 20;
  // DTRAIN_ELASTIC=1 (set by `dtrain launch --host-discovery-script`): the launcher assigns the
  // rank and the job's size at every Init (collectives/elastic), not DTRAIN_NODE_RANK.
  bool elastic = false;
  Duration elastic_timeout{600000};  // DTRAIN_ELASTIC_TIMEOUT_S: the longest wait for a membership
  // HOROVOD_GPU_OPERATIONS: "nccl", "host" (Horovod's GLOO or MPI: CUDA tensors staged through
  // host memory) or "" (unset: NCCL where it was built).
  std::string gpu_operations;
  // HOROVOD_HIERARCHICAL_ALLREDUCE=1: NCCL allreduces go within each host, across hosts through
  // host memory, and back (nccl/hierarchy.h).
  bool hierarchical_allreduce = false;
  CollectiveTuning tuning;
};

struct Config {
  // --- job layout (DMLC_*) ---
  std::optional<Role> role;     // DMLC_ROLE; unset outside a distributed job
  std::string scheduler_host;   // DMLC_PS_ROOT_URI
  uint16_t scheduler_port = 0;  // DMLC_PS_ROOT_PORT
  int num_servers = 0;          // DMLC_NUM_SERVER
  int num_workers = 0;          // DMLC_NUM_WORKER
  std::string interface;        // DMLC_INTERFACE: announce this interface's address
  std::string node_host;        // DMLC_NODE_HOST: announce exactly this address
  uint16_t node_port = 0;       // DMLC_NODE_PORT (0: any free port)
  int requested_rank = -1;      // DTRAIN_NODE_RANK: rank wanted (set by dtrain launch)
  int local_workers = 1;        // DTRAIN_LOCAL_WORKERS: the workers on this host (dtrain launch)

  // --- logging and reliability (PS_*) ---
  int verbose = 0;  // PS_VERBOSE: 0, 1 or 2
  // PS_RESEND (on by default): a TCP connection between members that breaks while both live is
  // re-established and its unacknowledged messages resent (tcp_transport.h).
  bool resend = true;
  Duration resend_timeout{1000};      // PS_RESEND_TIMEOUT (ms): the longest pause between attempts
  Duration resend_window{10000};      // DTRAIN_RESEND_WINDOW_MS: give up reconnecting after this
  Duration heartbeat_interval{1000};  // PS_HEARTBEAT_INTERVAL (ms)
  Duration heartbeat_timeout{15000};  // PS_HEARTBEAT_TIMEOUT (ms)

  // --- KVStore tuning (MXNET_KVSTORE_*) ---
  int64_t bigarray_bound = 1000000;  // MXNET_KVSTORE_BIGARRAY_BOUND (elements)
  int reduction_threads = 4;         // MXNET_KVSTORE_REDUCTION_NTHREADS

  // --- dtrain's own (DTRAIN_*) ---
  // DTRAIN_CONNECT_TIMEOUT_MS: reaching the scheduler / a peer, retried (a name that does not
  // resolve yet included) until then. In a Kubernetes pod the defaults of this and
  // start_timeout are the kPod ones.
  Duration connect_timeout{30000};
  static constexpr Duration kPodConnectTimeout{600000};
  static constexpr Duration kPodStartTimeout{900000};
  Duration hello_timeout{10000};  // DTRAIN_HELLO_TIMEOUT_MS: a connection's time to say hello
  // DTRAIN_LINK_TIMEOUT_MS: a data connection that acknowledges nothing (sent data, or TCP
  // keepalive probes when idle) for this long is closed by the kernel and its peer reported lost.
  // 0: the kernel's defaults (hours).
  Duration link_timeout{15000};
  Duration start_timeout{120000};      // DTRAIN_START_TIMEOUT_MS: all nodes registered
  Duration request_timeout{600000};    // DTRAIN_REQUEST_TIMEOUT_MS: one push/pull/barrier
  Duration failure_exit_grace{10000};  // DTRAIN_FAILURE_EXIT_MS: exit after a peer died
  // DTRAIN_RESTART_WAIT_MS: 0 (the default), a lost worker fails the job; otherwise the scheduler
  // and the servers wait this long for a replacement with its rank (`dtrain launch --max-restarts`
  // starts one and sets this to 60000 unless it is set).
  Duration restart_wait{0};
  // DTRAIN_RESTART_COUNT: how many replacements the launcher started before this process (0: an
  // original member). A server with one restores its rank's checkpoint (server.h).
  int restart_count = 0;
  // DTRAIN_CHECKPOINT_DIR: where servers write checkpoints ("" by default: none; `dtrain launch
  // --max-restarts` sets one). With it and restart_wait, a lost server is replaced too.
  std::string checkpoint_dir;
  // DTRAIN_SERVER_CHECKPOINT_S: seconds between a server's checkpoints (decimals allowed).
  Duration server_checkpoint_interval{30000};
  // DTRAIN_REPLAY_LOG_MB: what a worker keeps of its pushes since its servers' last checkpoints,
  // to repeat them to a restored server; at half of it the worker asks for a checkpoint. 0 (unset):
  // 64 rounds of its pushes, 256 to 512 MB (ps/push_log.h).
  size_t replay_log_bytes = 0;
  // A lost server is replaced (and workers keep what they push for it) rather than failing the job.
  bool ServersReplaceable() const { return restart_wait.count() > 0 && !checkpoint_dir.empty(); }
  // Defaults depend on the cores (FromEnvironment): half of them, 1 to 4. On a 2-core machine the
  // workers' compute needs both cores and every extra network thread costs wake-ups.
  int streams_per_peer = 2;  // DTRAIN_STREAMS_PER_PEER: TCP connections per peer
  int io_threads = 2;        // DTRAIN_IO_THREADS
  // DTRAIN_APPLY_THREADS: a server's threads that apply pushes and answer pulls, off the network
  // threads that receive them (ps/request_scheduler.h); 0: the network threads apply them.
  int apply_threads = 2;
  size_t chunk_bytes = size_t{4} << 20;  // DTRAIN_CHUNK_BYTES: values travel in pieces this big
  // DTRAIN_PARTITION_BYTES: a key under the big-array bound but bigger than this is split into
  // parts of at most this size, each placed on the least loaded server (BytePS's
  // BYTEPS_PARTITION_BYTES), so that no server's link carries much more than its share.
  size_t partition_bytes = size_t{512} << 10;
  // DTRAIN_TCP_NOTSENT_LOWAT: unsent bytes a TCP connection's kernel buffer takes (0: no limit);
  // small enough that a high-priority push overtakes what waits, large enough to fill the link.
  size_t tcp_notsent_lowat = 256 * 1024;
  // DTRAIN_TCP_SNDBUF: bytes a TCP connection we write to another host may hold in the kernel,
  // sent and not yet acknowledged included, as net.ipv4.tcp_wmem counts them; 0: the kernel's
  // autotuning; "auto" (kAdaptiveSendBuffer, the default): sized by each connection from its
  // round trip and rate (transport/tcp/send_buffer_tuner.h), so that a slow link's queue stays
  // short enough for priority to matter while a fast link still fills.
  static constexpr size_t kAdaptiveSendBuffer = SIZE_MAX;
  size_t tcp_send_buffer = kAdaptiveSendBuffer;
  // DTRAIN_TCP_LOCAL_CONGESTION: the congestion control of TCP connections within this host
  // ("system": the kernel's default). Loopback has no loss or queue to control, and a pacing
  // algorithm (BBR, some kernels' default) only spreads the sending out.
  std::string tcp_local_congestion = "cubic";
  bool same_host_direct = true;  // DTRAIN_SAME_HOST: one-copy path between local processes
  size_t max_message_bytes = size_t{1} << 32;  // DTRAIN_MAX_MESSAGE_BYTES: larger is rejected
  // DTRAIN_JOB_SECRET: when set, every connection proves knowledge of it (auth/job_auth.h) before
  // any message counts. Never printed. `dtrain launch` sets a fresh one per job.
  std::string job_secret;
  // DTRAIN_KEEP_FREED_MB: freed memory a worker's heap keeps for its next step instead of
  // returning it to the kernel (common/malloc_tuning.h); 0: glibc's defaults.
  size_t keep_freed_bytes = size_t{256} << 20;

  AllreduceSettings allreduce;

  // --- what a process tells its launcher ---
  std::string timeline_path;   // DTRAIN_TIMELINE, else HOROVOD_TIMELINE: "" is off
  std::string report_address;  // DTRAIN_REPORT_ADDR (host:port), set by dtrain launch
  std::string report_token;    // DTRAIN_REPORT_TOKEN, set with it

  bool distributed() const { return role.has_value(); }

  // Reads and validates everything. Throws ConfigError.
  static Config FromEnvironment(const EnvLookup& env = ProcessEnvironment());

  // Checks that the DMLC_* variables a distributed node needs are present. Throws ConfigError.
  void RequireDistributed(const std::string& why, bool servers_needed = true) const;

  // "name=value" lines of the values in effect, for PS_VERBOSE=1.
  std::string Describe() const;
};

// This process's environment, read once (the first call) and kept: for the parts of a process
// that have no Config handed to them (its reports to the launcher, its timeline). A malformed
// variable is logged there once, naming it, and the defaults stand in (the node's own
// Config::FromEnvironment fails on the same variable with the same message).
const Config& ProcessConfig();

}  // namespace dtrain

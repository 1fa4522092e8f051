#include "common/config/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <thread>

#include "common/config/operator_env.h"
#include "common/logging.h"
#include "common/usable_cores.h"
#include "dtrain/common/error.h"

namespace dtrain {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kScheduler:
      return "scheduler";
    case Role::kServer:
      return "server";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

std::optional<Role> RoleFromName(const std::string& name) {
  for (Role r : {Role::kScheduler, Role::kServer, Role::kWorker}) {
    if (name == RoleName(r)) return r;
  }
  return std::nullopt;
}

std::optional<size_t> KeepFreedBytesFromEnvironment(const EnvReader& r) {
  if (auto mb = r.Integer("DTRAIN_KEEP_FREED_MB", 0, 1024)) return static_cast<size_t>(*mb) << 20;
  return std::nullopt;
}

std::string JobSecretFromVariable(const std::optional<std::string>& value) {
  if (!value) return "";
  if (value->empty()) {
    // Unlike other variables, NAME= is refused here: it looks like a secret was meant, and a job
    // without one admits anybody who reaches its ports.
    throw ConfigError(
        "DTRAIN_JOB_SECRET is set but empty: unset it to run without a secret, or give one of at "
        "least " +
        std::to_string(kMinSecretChars) + " characters (e.g. `openssl rand -hex 32`)");
  }
  if (value->size() < kMinSecretChars) {
    throw ConfigError("DTRAIN_JOB_SECRET is too short (" + std::to_string(value->size()) +
                      " characters; at least " + std::to_string(kMinSecretChars) +
                      "; e.g. `openssl rand -hex 32`)");
  }
  return *value;
}

std::string JobSecretFromEnvironment(const EnvReader& r) {
  return JobSecretFromVariable(r.TextAsSet("DTRAIN_JOB_SECRET"));
}

std::string TimelinePathFromEnvironment(const EnvReader& r) {
  if (auto v = r.First({"DTRAIN_TIMELINE", "HOROVOD_TIMELINE"})) return v->second;
  return "";
}

namespace {

// The name of a TCP congestion control algorithm as the kernel spells them (at most 15 lower-case
// letters, digits or '_'), or "system".
std::optional<std::string> CongestionControl(const EnvReader& r, const std::string& name) {
  auto text = r.Text(name);
  if (!text) return std::nullopt;
  const bool well_formed =
      text->size() <= 15 && std::all_of(text->begin(), text->end(), [](char ch) {
        return std::islower(static_cast<unsigned char>(ch)) ||
               std::isdigit(static_cast<unsigned char>(ch)) || ch == '_';
      });
  if (!well_formed) {
    throw ConfigError(name + "='" + *text +
                      "' is not a congestion control algorithm's name (cubic, reno, bbr, ...; "
                      "or system)");
  }
  return text;
}

// The workers on this host: dtrain launch's count, else what horovodrun, mpirun or torchrun report
// (python/dtrain/_threads.py reads the same list). Theirs are not checked: a value that is not a
// positive count is passed over, as in Python.
int LocalWorkers(const EnvReader& r) {
  if (auto v = r.Integer("DTRAIN_LOCAL_WORKERS", 1, 1 << 20)) return static_cast<int>(*v);
  for (const char* name :
       {"HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}) {
    const std::string text = r.Text(name).value_or("");
    int n = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (error == std::errc() && end == text.data() + text.size() && n > 0) return n;
  }
  return 1;
}

AllreduceSettings ReadAllreduce(const EnvReader& r) {
  AllreduceSettings a;
  a.backend = r.Choice("DTRAIN_COLLECTIVES", {"mpi", "gloo"}).value_or("");
  a.under_mpirun = r.Text("OMPI_COMM_WORLD_SIZE").has_value();
  a.gloo_file_store = r.Text("DTRAIN_GLOO_FILE_STORE").value_or("");
  a.gloo_algorithm = r.Choice("DTRAIN_GLOO_ALGORITHM",
                              {"auto", "ring", "ring_chunked", "halving_doubling", "bcube"})
                         .value_or("");
  if (auto v = r.Boolean("DTRAIN_GLOO_SHM")) a.gloo_shared_memory = *v;
  if (auto v = r.Integer("DTRAIN_MPI_RING_BYTES", 0, int64_t{1} << 40)) {
    a.mpi_ring_bytes = static_cast<size_t>(*v);
  }
  if (auto v = r.Boolean("DTRAIN_ELASTIC")) a.elastic = *v;
  if (auto v = r.Integer("DTRAIN_ELASTIC_TIMEOUT_S", 1, 1 << 24))
    a.elastic_timeout = Duration(*v * 1000);
  if (auto v = r.Choice("HOROVOD_GPU_OPERATIONS", {"NCCL", "GLOO", "MPI", "nccl", "gloo", "mpi"})) {
    a.gpu_operations = (*v == "NCCL" || *v == "nccl") ? "nccl" : "host";
  }
  if (auto v = r.Boolean("HOROVOD_HIERARCHICAL_ALLREDUCE")) a.hierarchical_allreduce = *v;
  if (auto v = r.Integer("DTRAIN_FUSION_THRESHOLD_MB", 0, 1 << 16)) {
    a.tuning.fusion_threshold_bytes = static_cast<size_t>(*v) << 20;
  } else if (auto v = r.Integer("HOROVOD_FUSION_THRESHOLD", 0, int64_t{1} << 36)) {
    a.tuning.fusion_threshold_bytes = static_cast<size_t>(*v);
  }
  if (auto v = r.First({"DTRAIN_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME"})) {
    const double ms = EnvReader::ParseDecimal(v->first, v->second, 0, 60000);
    a.tuning.cycle_time = std::chrono::microseconds(static_cast<int64_t>(std::llround(ms * 1000)));
  }
  if (auto v = r.First({"DTRAIN_STALL_WARNING_S", "HOROVOD_STALL_CHECK_TIME_SECONDS"})) {
    a.tuning.stall_warning =
        Duration(EnvReader::ParseInteger(v->first, v->second, 0, 1 << 24) * 1000);
  }
  r.Millis("DTRAIN_COLLECTIVE_TIMEOUT_MS", &a.tuning.collective_timeout);
  r.Millis("DTRAIN_DEADLOCK_MS", &a.tuning.deadlock_grace, 0);
  if (auto v = r.Integer("DTRAIN_SPIN_WAIT_US", 0, 1000000)) {
    a.tuning.spin_wait = std::chrono::microseconds(*v);
  }
  if (auto v = r.Boolean("DTRAIN_FP16_ALLREDUCE")) a.tuning.fp16_allreduce = *v;
  if (auto v = r.Boolean("HOROVOD_AUTOTUNE")) a.tuning.autotune = *v;
  if (auto v = r.Integer("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", 0, 1000)) {
    a.tuning.autotune_warmup_samples = static_cast<int>(*v);
  }
  if (auto v = r.Integer("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", 1, 100000)) {
    a.tuning.autotune_steps_per_sample = static_cast<int>(*v);
  }
  a.tuning.autotune_log = r.Text("HOROVOD_AUTOTUNE_LOG").value_or("");
  return a;
}

}  // namespace

Config Config::FromEnvironment(const EnvLookup& process_env) {
  // Under Kubeflow's operators, what dtrain's variables leave unset comes from theirs.
  const EnvLookup env = WithOperatorVariables(process_env);
  const EnvReader r(env);
  Config c;
  if (auto role = r.Text("DMLC_ROLE")) {
    c.role = RoleFromName(*role);
    if (!c.role)
      throw ConfigError("DMLC_ROLE='" + *role + "' is not one of scheduler, server, worker");
  }
  c.scheduler_host = r.Text("DMLC_PS_ROOT_URI").value_or("");
  if (auto v = r.Integer("DMLC_PS_ROOT_PORT", 1, 65535))
    c.scheduler_port = static_cast<uint16_t>(*v);
  if (auto v = r.Integer("DMLC_NUM_SERVER", 0, 1 << 16)) c.num_servers = static_cast<int>(*v);
  if (auto v = r.Integer("DMLC_NUM_WORKER", 0, 1 << 16)) c.num_workers = static_cast<int>(*v);
  c.interface = r.Text("DMLC_INTERFACE").value_or("");
  c.node_host = r.Text("DMLC_NODE_HOST").value_or("");
  if (auto v = r.Integer("DMLC_NODE_PORT", 0, 65535)) c.node_port = static_cast<uint16_t>(*v);

  if (auto v = r.Integer("DTRAIN_NODE_RANK", 0, 1 << 16)) c.requested_rank = static_cast<int>(*v);
  if (auto v = r.Integer("PS_VERBOSE", 0, 2)) c.verbose = static_cast<int>(*v);
  if (auto v = r.Boolean("PS_RESEND")) c.resend = *v;
  r.Millis("PS_RESEND_TIMEOUT", &c.resend_timeout);
  r.Millis("PS_HEARTBEAT_INTERVAL", &c.heartbeat_interval);
  r.Millis("PS_HEARTBEAT_TIMEOUT", &c.heartbeat_timeout);

  if (auto v = r.Integer("MXNET_KVSTORE_BIGARRAY_BOUND", 1, std::numeric_limits<int64_t>::max())) {
    c.bigarray_bound = *v;
  }
  if (auto v = r.Integer("MXNET_KVSTORE_REDUCTION_NTHREADS", 1, 256)) {
    c.reduction_threads = static_cast<int>(*v);
  }

  const int half_the_cores = std::clamp(UsableCores() / 2, 1, 4);
  c.streams_per_peer = half_the_cores;
  c.io_threads = half_the_cores;
  c.apply_threads = half_the_cores;
  // In a Kubernetes pod (the kubelet sets KUBERNETES_SERVICE_HOST in every container; MXJob's
  // pods also get DMLC_USE_KUBERNETES=1) a peer's pod may sit Pending or pull its image for
  // minutes, and its name resolves only once it is Ready: the defaults wait for that.
  if (r.Text("KUBERNETES_SERVICE_HOST") || r.Boolean("DMLC_USE_KUBERNETES").value_or(false)) {
    c.connect_timeout = Config::kPodConnectTimeout;
    c.start_timeout = Config::kPodStartTimeout;
  }
  r.Millis("DTRAIN_CONNECT_TIMEOUT_MS", &c.connect_timeout);
  r.Millis("DTRAIN_HELLO_TIMEOUT_MS", &c.hello_timeout);
  r.Millis("DTRAIN_LINK_TIMEOUT_MS", &c.link_timeout, 0);
  r.Millis("DTRAIN_RESEND_WINDOW_MS", &c.resend_window);
  r.Millis("DTRAIN_START_TIMEOUT_MS", &c.start_timeout);
  c.local_workers = LocalWorkers(r);
  r.Millis("DTRAIN_REQUEST_TIMEOUT_MS", &c.request_timeout);
  r.Millis("DTRAIN_FAILURE_EXIT_MS", &c.failure_exit_grace, 0);
  r.Millis("DTRAIN_RESTART_WAIT_MS", &c.restart_wait, 0);
  if (auto v = r.Integer("DTRAIN_RESTART_COUNT", 0, 1 << 20))
    c.restart_count = static_cast<int>(*v);
  if (auto v = r.Text("DTRAIN_CHECKPOINT_DIR")) c.checkpoint_dir = *v;
  if (auto v = r.Decimal("DTRAIN_SERVER_CHECKPOINT_S", 0.001, 1e6)) {
    c.server_checkpoint_interval = Duration(static_cast<int64_t>(*v * 1000));
  }
  if (auto v = r.Integer("DTRAIN_REPLAY_LOG_MB", 1, int64_t{1} << 20)) {
    c.replay_log_bytes = static_cast<size_t>(*v) << 20;
  }
  if (auto v = KeepFreedBytesFromEnvironment(r)) c.keep_freed_bytes = *v;
  if (auto v = r.Integer("DTRAIN_STREAMS_PER_PEER", 1, 16))
    c.streams_per_peer = static_cast<int>(*v);
  if (auto v = r.Integer("DTRAIN_IO_THREADS", 1, 64)) c.io_threads = static_cast<int>(*v);
  if (auto v = r.Integer("DTRAIN_APPLY_THREADS", 0, 64)) c.apply_threads = static_cast<int>(*v);
  if (auto v = r.Integer("DTRAIN_CHUNK_BYTES", 4096, int64_t{1} << 40)) c.chunk_bytes = *v;
  if (auto v = r.Integer("DTRAIN_PARTITION_BYTES", 4096, int64_t{1} << 40)) c.partition_bytes = *v;
  if (auto v = r.Integer("DTRAIN_TCP_NOTSENT_LOWAT", 0, int64_t{1} << 30)) c.tcp_notsent_lowat = *v;
  const auto send_buffer = r.Text("DTRAIN_TCP_SNDBUF");
  if (send_buffer == "auto") {
    c.tcp_send_buffer = Config::kAdaptiveSendBuffer;
  } else if (send_buffer && std::isalpha(static_cast<unsigned char>((*send_buffer)[0]))) {
    throw ConfigError("DTRAIN_TCP_SNDBUF='" + *send_buffer +
                      "' is not an integer (a byte count) nor auto");
  } else if (auto v = r.Integer("DTRAIN_TCP_SNDBUF", 0, int64_t{1} << 30)) {
    c.tcp_send_buffer = *v;
  }
  if (auto v = CongestionControl(r, "DTRAIN_TCP_LOCAL_CONGESTION")) c.tcp_local_congestion = *v;
  if (auto v = r.Boolean("DTRAIN_SAME_HOST")) c.same_host_direct = *v;
  if (auto v = r.Integer("DTRAIN_MAX_MESSAGE_BYTES", 1 << 20, int64_t{1} << 40)) {
    c.max_message_bytes = *v;
  }
  c.job_secret = JobSecretFromEnvironment(r);
  c.allreduce = ReadAllreduce(r);
  c.timeline_path = TimelinePathFromEnvironment(r);
  c.report_address = r.Text("DTRAIN_REPORT_ADDR").value_or("");
  c.report_token = r.Text("DTRAIN_REPORT_TOKEN").value_or("");
  // A worker of an allreduce job (`dtrain launch -s 0`: DMLC_NUM_SERVER=0) has no servers to
  // need; the dist kvstores still refuse such a job when they are created.
  const bool allreduce_worker =
      c.role == Role::kWorker && r.Text("DMLC_NUM_SERVER").value_or("") == "0";
  // An elastic job's worker learns the job's size from the launcher (collectives/elastic).
  if (c.role && !(allreduce_worker && c.allreduce.elastic)) {
    c.RequireDistributed(std::string("DMLC_ROLE=") + RoleName(*c.role),
                         /*servers_needed=*/!allreduce_worker);
  }
  return c;
}

void Config::RequireDistributed(const std::string& why, bool servers_needed) const {
  auto missing = [&why](const char* name) {
    return ConfigError(std::string(name) + " is not set (needed because " + why +
                       "); start the job with `dtrain launch` or set DMLC_ROLE, DMLC_PS_ROOT_URI, "
                       "DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER and DMLC_NUM_WORKER");
  };
  if (!role) throw missing("DMLC_ROLE");
  if (scheduler_host.empty()) throw missing("DMLC_PS_ROOT_URI");
  if (scheduler_port == 0) throw missing("DMLC_PS_ROOT_PORT");
  if (servers_needed && num_servers < 1) {
    throw ConfigError(
        "DMLC_NUM_SERVER is not set or 0 (needed because " + why +
        "; a parameter-server job needs at least one server; a job started with -s 0 is an "
        "allreduce job: use --kvstore horovod)");
  }
  if (num_workers < 1) {
    throw ConfigError("DMLC_NUM_WORKER is not set or 0 (needed because " + why +
                      "; a job needs at least one worker)");
  }
}

std::string Config::Describe() const {
  std::ostringstream out;
  out << "DMLC_ROLE=" << (role ? RoleName(*role) : "(unset)")
      << " DMLC_PS_ROOT_URI=" << scheduler_host << " DMLC_PS_ROOT_PORT=" << scheduler_port
      << " DMLC_NUM_SERVER=" << num_servers << " DMLC_NUM_WORKER=" << num_workers
      << " DMLC_INTERFACE=" << interface << " DMLC_NODE_HOST=" << node_host
      << " DMLC_NODE_PORT=" << node_port << " DTRAIN_NODE_RANK=" << requested_rank
      << " PS_VERBOSE=" << verbose << " PS_RESEND=" << resend
      << " PS_RESEND_TIMEOUT=" << resend_timeout.count()
      << " DTRAIN_RESEND_WINDOW_MS=" << resend_window.count()
      << " PS_HEARTBEAT_INTERVAL=" << heartbeat_interval.count()
      << " PS_HEARTBEAT_TIMEOUT=" << heartbeat_timeout.count()
      << " MXNET_KVSTORE_BIGARRAY_BOUND=" << bigarray_bound
      << " MXNET_KVSTORE_REDUCTION_NTHREADS=" << reduction_threads
      << " DTRAIN_CONNECT_TIMEOUT_MS=" << connect_timeout.count()
      << " DTRAIN_HELLO_TIMEOUT_MS=" << hello_timeout.count()
      << " DTRAIN_LINK_TIMEOUT_MS=" << link_timeout.count()
      << " DTRAIN_START_TIMEOUT_MS=" << start_timeout.count()
      << " DTRAIN_REQUEST_TIMEOUT_MS=" << request_timeout.count()
      << " DTRAIN_STREAMS_PER_PEER=" << streams_per_peer << " DTRAIN_IO_THREADS=" << io_threads
      << " DTRAIN_APPLY_THREADS=" << apply_threads << " DTRAIN_CHUNK_BYTES=" << chunk_bytes
      << " DTRAIN_PARTITION_BYTES=" << partition_bytes
      << " DTRAIN_TCP_NOTSENT_LOWAT=" << tcp_notsent_lowat << " DTRAIN_TCP_SNDBUF="
      << (tcp_send_buffer == kAdaptiveSendBuffer ? "auto" : std::to_string(tcp_send_buffer))
      << " DTRAIN_TCP_LOCAL_CONGESTION=" << tcp_local_congestion
      << " DTRAIN_FAILURE_EXIT_MS=" << failure_exit_grace.count()
      << " DTRAIN_RESTART_WAIT_MS=" << restart_wait.count()
      << " DTRAIN_CHECKPOINT_DIR=" << (checkpoint_dir.empty() ? "(unset)" : checkpoint_dir)
      << " DTRAIN_SERVER_CHECKPOINT_S=" << server_checkpoint_interval.count() / 1000.0
      << " DTRAIN_REPLAY_LOG_MB="
      << (replay_log_bytes == 0 ? std::string("auto") : std::to_string(replay_log_bytes >> 20))
      << " DTRAIN_KEEP_FREED_MB=" << (keep_freed_bytes >> 20)
      << " DTRAIN_MAX_MESSAGE_BYTES=" << max_message_bytes
      << " DTRAIN_SAME_HOST=" << same_host_direct
      << " DTRAIN_JOB_SECRET=" << (job_secret.empty() ? "(unset)" : "(set)")
      << " DTRAIN_TIMELINE=" << timeline_path;
  return out.str();
}

const Config& ProcessConfig() {
  static const Config config = [] {
    try {
      return Config::FromEnvironment();
    } catch (const ConfigError& e) {
      DTRAIN_LOG(kError) << e.what();
      return Config{};
    }
  }();
  return config;
}

}  // namespace dtrain

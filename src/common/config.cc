#include "common/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/job_auth.h"

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

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup MapEnvironment(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

namespace {

class Reader {
 public:
  explicit Reader(const EnvLookup& env) : env_(env) {}

  std::optional<std::string> Text(const std::string& name) {
    auto v = env_(name);
    if (v && v->empty()) return std::nullopt;  // NAME= counts as unset, as in the shell
    return v;
  }

  std::optional<int64_t> Integer(const std::string& name, int64_t min, int64_t max) {
    auto text = Text(name);
    if (!text) return std::nullopt;
    // Digits with an optional leading minus only: no spaces, no '+', no hex.
    const char first = (*text)[0];
    if (!(std::isdigit(static_cast<unsigned char>(first)) || first == '-')) {
      throw ConfigError(name + "='" + *text + "' is not an integer");
    }
    errno = 0;
    char* end = nullptr;
    long long value = std::strtoll(text->c_str(), &end, 10);
    if (end == text->c_str() || *end != '\0') {
      throw ConfigError(name + "='" + *text + "' is not an integer");
    }
    if (errno == ERANGE) {
      throw ConfigError(name + "=" + *text + " is out of range [" + std::to_string(min) + ", " +
                        std::to_string(max) + "]");
    }
    if (value < min || value > max) {
      throw ConfigError(name + "=" + *text + " is out of range [" + std::to_string(min) + ", " +
                        std::to_string(max) + "]");
    }
    return value;
  }

  std::optional<bool> Boolean(const std::string& name) {
    auto text = Text(name);
    if (!text) return std::nullopt;
    if (*text == "1" || *text == "true" || *text == "TRUE" || *text == "yes") return true;
    if (*text == "0" || *text == "false" || *text == "FALSE" || *text == "no") return false;
    throw ConfigError(name + "='" + *text + "' is not a boolean (use 0 or 1)");
  }

  // The name of a TCP congestion control algorithm as the kernel spells them (at most 15 lower-case
  // letters, digits or '_'), or "system".
  std::optional<std::string> CongestionControl(const std::string& name) {
    auto text = Text(name);
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

  void Millis(const std::string& name, Duration* out, int64_t min = 1) {
    if (auto v = Integer(name, min, int64_t{1} << 40)) *out = Duration(*v);
  }

 private:
  const EnvLookup& env_;
};

}  // namespace

Config Config::FromEnvironment(const EnvLookup& env) {
  Reader r(env);
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

  const int half_the_cores =
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 4);
  c.streams_per_peer = half_the_cores;
  c.io_threads = half_the_cores;
  r.Millis("DTRAIN_CONNECT_TIMEOUT_MS", &c.connect_timeout);
  r.Millis("DTRAIN_HELLO_TIMEOUT_MS", &c.hello_timeout);
  r.Millis("DTRAIN_LINK_TIMEOUT_MS", &c.link_timeout, 0);
  r.Millis("DTRAIN_RESEND_WINDOW_MS", &c.resend_window);
  r.Millis("DTRAIN_START_TIMEOUT_MS", &c.start_timeout);
  r.Millis("DTRAIN_REQUEST_TIMEOUT_MS", &c.request_timeout);
  r.Millis("DTRAIN_FAILURE_EXIT_MS", &c.failure_exit_grace, 0);
  if (auto v = r.Integer("DTRAIN_STREAMS_PER_PEER", 1, 16))
    c.streams_per_peer = static_cast<int>(*v);
  if (auto v = r.Integer("DTRAIN_IO_THREADS", 1, 64)) c.io_threads = static_cast<int>(*v);
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
  if (auto v = r.CongestionControl("DTRAIN_TCP_LOCAL_CONGESTION")) c.tcp_local_congestion = *v;
  if (auto v = r.Boolean("DTRAIN_SAME_HOST")) c.same_host_direct = *v;
  if (auto v = r.Integer("DTRAIN_MAX_MESSAGE_BYTES", 1 << 20, int64_t{1} << 40)) {
    c.max_message_bytes = *v;
  }
  c.job_secret = auth::SecretFromVariable(env("DTRAIN_JOB_SECRET"));
  // A worker of an allreduce job (`dtrain launch -s 0`: DMLC_NUM_SERVER=0) has no servers to
  // need; the dist kvstores still refuse such a job when they are created.
  const bool allreduce_worker =
      c.role == Role::kWorker && env("DMLC_NUM_SERVER").value_or("") == "0";
  if (c.role) {
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
      << " DTRAIN_CHUNK_BYTES=" << chunk_bytes << " DTRAIN_PARTITION_BYTES=" << partition_bytes
      << " DTRAIN_TCP_NOTSENT_LOWAT=" << tcp_notsent_lowat << " DTRAIN_TCP_SNDBUF="
      << (tcp_send_buffer == kAdaptiveSendBuffer ? "auto" : std::to_string(tcp_send_buffer))
      << " DTRAIN_TCP_LOCAL_CONGESTION=" << tcp_local_congestion
      << " DTRAIN_FAILURE_EXIT_MS=" << failure_exit_grace.count()
      << " DTRAIN_MAX_MESSAGE_BYTES=" << max_message_bytes
      << " DTRAIN_SAME_HOST=" << same_host_direct
      << " DTRAIN_JOB_SECRET=" << (job_secret.empty() ? "(unset)" : "(set)");
  return out.str();
}

}  // namespace dtrain

#include "collectives/config.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/error.h"
#include "common/job_auth.h"

namespace dtrain::collectives {
namespace {

// Reads one variable at a time; every failure names the variable and its value.
class Reader {
 public:
  explicit Reader(const EnvLookup& env) : env_(env) {}

  std::optional<std::string> Text(const std::string& name) const {
    auto v = env_(name);
    if (v && v->empty()) return std::nullopt;  // NAME= counts as unset, as in the shell
    return v;
  }

  // The first of `names` that is set, with the name it came from.
  std::optional<std::pair<std::string, std::string>> First(
      std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      if (auto v = Text(name)) return std::make_pair(std::string(name), *v);
    }
    return std::nullopt;
  }

  static double Number(const std::string& name, const std::string& text, double min, double max) {
    // Digits and one optional '.': no signs, spaces, exponents or hex, which strtod would accept.
    bool dot = false;
    bool ok = !text.empty();
    for (char c : text) {
      if (c == '.' && !dot) {
        dot = true;
      } else if (!std::isdigit(static_cast<unsigned char>(c))) {
        ok = false;
      }
    }
    if (!ok || text == ".")
      throw ConfigError(name + "='" + text + "' is not a non-negative number");
    errno = 0;
    const double value = std::strtod(text.c_str(), nullptr);
    if (errno == ERANGE || value < min || value > max) {
      std::ostringstream range;
      range << name << "=" << text << " is out of range [" << min << ", " << max << "]";
      throw ConfigError(range.str());
    }
    return value;
  }

  static int64_t Integer(const std::string& name, const std::string& text, int64_t min,
                         int64_t max) {
    if (text.find('.') != std::string::npos) {
      throw ConfigError(name + "='" + text + "' is not an integer");
    }
    return static_cast<int64_t>(
        Number(name, text, static_cast<double>(min), static_cast<double>(max)));
  }

  std::optional<int64_t> Integer(const char* name, int64_t min, int64_t max) const {
    auto v = Text(name);
    if (!v) return std::nullopt;
    return Integer(name, *v, min, max);
  }

  std::optional<bool> Boolean(const char* name) const {
    auto text = Text(name);
    if (!text) return std::nullopt;
    if (*text == "1" || *text == "true" || *text == "TRUE" || *text == "yes") return true;
    if (*text == "0" || *text == "false" || *text == "FALSE" || *text == "no") return false;
    throw ConfigError(std::string(name) + "='" + *text + "' is not a boolean (use 0 or 1)");
  }

 private:
  const EnvLookup& env_;
};

constexpr int64_t kMaxMillis = int64_t{1} << 40;
constexpr int kMaxRanks = 1 << 16;

void ReadGlooLayout(const Reader& r, CollectivesConfig* c) {
  auto rank = r.Integer("DTRAIN_NODE_RANK", 0, kMaxRanks - 1);
  auto size = r.Integer("DMLC_NUM_WORKER", 1, kMaxRanks);
  if (!rank && !size) {
    // A script started by hand, outside any launcher: a job of one.
    c->rank = 0;
    c->size = 1;
  } else if (!rank || !size) {
    throw ConfigError(std::string(rank ? "DMLC_NUM_WORKER" : "DTRAIN_NODE_RANK") +
                      " is not set (DTRAIN_COLLECTIVES=gloo needs DTRAIN_NODE_RANK and "
                      "DMLC_NUM_WORKER; start the job with `dtrain launch -s 0` or mpirun)");
  } else {
    c->rank = static_cast<int>(*rank);
    c->size = static_cast<int>(*size);
  }
  if (c->rank >= c->size) {
    throw ConfigError("DTRAIN_NODE_RANK=" + std::to_string(c->rank) +
                      " is not below DMLC_NUM_WORKER=" + std::to_string(c->size));
  }
  c->file_store_dir = r.Text("DTRAIN_GLOO_FILE_STORE").value_or("");
  c->rendezvous_host = r.Text("DMLC_PS_ROOT_URI").value_or("");
  if (auto port = r.Integer("DMLC_PS_ROOT_PORT", 1, 65535)) {
    c->rendezvous_port = static_cast<uint16_t>(*port);
  }
  const bool tcp = !c->rendezvous_host.empty() && c->rendezvous_port != 0;
  if (c->size > 1 && c->file_store_dir.empty() && !tcp) {
    throw ConfigError(
        std::string(c->rendezvous_host.empty() ? "DMLC_PS_ROOT_URI" : "DMLC_PS_ROOT_PORT") +
        " is not set: a gloo job of " + std::to_string(c->size) +
        " workers needs a rendezvous, DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT (rank 0 listens "
        "there) or DTRAIN_GLOO_FILE_STORE (a directory every worker shares)");
  }
  c->interface = r.Text("DMLC_INTERFACE").value_or("");
  c->node_host = r.Text("DMLC_NODE_HOST").value_or("");
  c->gloo_algorithm = r.Text("DTRAIN_GLOO_ALGORITHM").value_or("");
  if (!c->gloo_algorithm.empty() && c->gloo_algorithm != "auto" && c->gloo_algorithm != "ring" &&
      c->gloo_algorithm != "ring_chunked" && c->gloo_algorithm != "halving_doubling" &&
      c->gloo_algorithm != "bcube") {
    throw ConfigError("DTRAIN_GLOO_ALGORITHM='" + c->gloo_algorithm +
                      "' is not one of auto, ring, ring_chunked, halving_doubling, bcube");
  }
  if (auto v = r.Boolean("DTRAIN_GLOO_SHM")) c->shared_memory = *v;
}

}  // namespace

const char* BackendName(BackendKind kind) { return kind == BackendKind::kMpi ? "mpi" : "gloo"; }

CollectivesConfig CollectivesConfig::FromEnvironment(const EnvLookup& env) {
  Reader r(env);
  CollectivesConfig c;
  if (auto name = r.Text("DTRAIN_COLLECTIVES")) {
    if (*name == "mpi") {
      c.backend = BackendKind::kMpi;
    } else if (*name == "gloo") {
      c.backend = BackendKind::kGloo;
    } else {
      throw ConfigError("DTRAIN_COLLECTIVES='" + *name + "' is not one of mpi, gloo");
    }
  } else {
    c.backend = r.Text("OMPI_COMM_WORLD_SIZE") ? BackendKind::kMpi : BackendKind::kGloo;
  }
  if (c.backend == BackendKind::kGloo) ReadGlooLayout(r, &c);
  c.job_secret = auth::SecretFromVariable(env("DTRAIN_JOB_SECRET"));

  if (auto v = r.First({"DTRAIN_FUSION_THRESHOLD_MB"})) {
    c.fusion_threshold_bytes = static_cast<size_t>(Reader::Integer(v->first, v->second, 0, 1 << 16))
                               << 20;
  } else if (auto v = r.First({"HOROVOD_FUSION_THRESHOLD"})) {
    c.fusion_threshold_bytes =
        static_cast<size_t>(Reader::Integer(v->first, v->second, 0, int64_t{1} << 36));
  }
  if (auto v = r.First({"DTRAIN_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME"})) {
    const double ms = Reader::Number(v->first, v->second, 0, 60000);
    c.cycle_time = std::chrono::microseconds(static_cast<int64_t>(std::llround(ms * 1000)));
  }
  if (auto v = r.First({"DTRAIN_STALL_WARNING_S", "HOROVOD_STALL_CHECK_TIME_SECONDS"})) {
    c.stall_warning = Duration(Reader::Integer(v->first, v->second, 0, 1 << 24) * 1000);
  }
  if (auto v = r.Integer("DTRAIN_COLLECTIVE_TIMEOUT_MS", 1, kMaxMillis)) {
    c.collective_timeout = Duration(*v);
  }
  if (auto v = r.Integer("DTRAIN_CONNECT_TIMEOUT_MS", 1, kMaxMillis)) {
    c.connect_timeout = Duration(*v);
  }
  if (auto v = r.Boolean("DTRAIN_FP16_ALLREDUCE")) c.fp16_allreduce = *v;
  if (auto v = r.Integer("PS_VERBOSE", 0, 2)) c.verbose = static_cast<int>(*v);
  return c;
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
  }
  out << " DTRAIN_FUSION_THRESHOLD_BYTES=" << fusion_threshold_bytes
      << " DTRAIN_CYCLE_TIME_MS=" << static_cast<double>(cycle_time.count()) / 1000.0
      << " DTRAIN_STALL_WARNING_S=" << stall_warning.count() / 1000
      << " DTRAIN_COLLECTIVE_TIMEOUT_MS=" << collective_timeout.count()
      << " DTRAIN_CONNECT_TIMEOUT_MS=" << connect_timeout.count()
      << " DTRAIN_FP16_ALLREDUCE=" << fp16_allreduce;
  return out.str();
}

}  // namespace dtrain::collectives

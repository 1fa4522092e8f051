#include "launcher/status/job_status.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>

namespace dtrain::launcher {
namespace {

constexpr size_t kMaxErrorsPerNode = 20;
constexpr size_t kMaxJobErrors = 200;
constexpr size_t kMaxText = 2000;

std::string Clip(std::string text) {
  if (text.size() > kMaxText) text = text.substr(0, kMaxText) + "...";
  return text;
}

// A number field of `record`, if it is one of T's kind: a count must be an integer (a float out
// of int64's range would not convert).
template <typename T>
bool Read(const nlohmann::json& record, const char* name, T* out) {
  auto it = record.find(name);
  if (it == record.end()) return false;
  if (std::is_integral_v<T> ? !it->is_number_integer() : !it->is_number()) return false;
  *out = it->get<T>();
  return true;
}

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", s);
  return text;
}

}  // namespace

std::string NodeKey::Name() const {
  if (role == Role::kScheduler) return "scheduler";
  return std::string(RoleName(role)) + " " + std::to_string(rank);
}

std::string FailureRecord::Text() const {
  // The scheduler is one of a kind; a rank reporting a peer is named as itself.
  const std::string witness = reporter == "scheduler" ? "the scheduler" : reporter;
  return node.Name() + " failed: " + cause + " (reported by " + witness + ")";
}

std::optional<NodeKey> ParseNodeKey(const nlohmann::json& object) {
  if (!object.is_object()) return std::nullopt;
  auto role = object.find("role");
  auto rank = object.find("rank");
  if (role == object.end() || !role->is_string() || rank == object.end() ||
      !rank->is_number_integer()) {
    return std::nullopt;
  }
  auto r = RoleFromName(role->get<std::string>());
  const int64_t n = rank->get<int64_t>();
  if (!r || n < 0 || n > (int64_t{1} << 30)) return std::nullopt;
  return NodeKey{*r, static_cast<int>(n)};
}

NodeStatus& JobStatus::Node(const NodeKey& key) {
  NodeStatus& n = nodes_[key];
  n.key = key;
  return n;
}

void JobStatus::ProcessStarted(const NodeKey& key, const std::string& host, int64_t pid,
                               int64_t now_us) {
  NodeStatus& n = Node(key);
  n.host = host;
  n.pid = pid;
}

void JobStatus::JobReset(const std::string& what, int64_t now_us) {
  if (resets_.size() >= 1000) return;
  char at[32];
  std::snprintf(at, sizeof(at), "at %.1f s: ", static_cast<double>(now_us - start_us_) / 1e6);
  resets_.push_back(at + what);
}

void JobStatus::ProcessRestarted(const NodeKey& key, const std::string& why, int64_t pid,
                                 int64_t now_us) {
  NodeStatus& n = Node(key);
  char at[32];
  std::snprintf(at, sizeof(at), "at %.1f s: ", static_cast<double>(now_us - start_us_) / 1e6);
  if (n.restarts.size() < kMaxErrorsPerNode) n.restarts.push_back(at + Clip(why));
  n.pid = pid;
  n.state = "starting";
  n.exit.clear();
}

void JobStatus::ProcessExited(const NodeKey& key, bool succeeded, const std::string& description,
                              int64_t now_us) {
  NodeStatus& n = Node(key);
  n.state = succeeded ? "finished" : "failed";
  n.exit = description;
}

std::optional<FailureRecord> JobStatus::Apply(const NodeKey& from, const nlohmann::json& record,
                                              int64_t now_us) {
  if (!record.is_object() || !record.contains("kind") || !record["kind"].is_string()) {
    ++dropped_;
    return std::nullopt;
  }
  const std::string kind = record["kind"].get<std::string>();
  NodeStatus& n = Node(from);
  n.last_heard_us = now_us;
  if (auto host = record.find("host"); host != record.end() && host->is_string()) {
    n.host = Clip(host->get<std::string>());
  }
  if (n.state == "starting") n.state = "running";
  if (kind == "progress") {
    Read(record, "steps", &n.steps);
    Read(record, "samples", &n.samples);
    Read(record, "samples_per_s", &n.samples_per_s);
    Read(record, "steps_per_s", &n.steps_per_s);
    Read(record, "wait_s", &n.wait_s);
    Read(record, "active_s", &n.active_s);
    Read(record, "timed_samples", &n.timed_samples);
  } else if (kind == "traffic") {
    Read(record, "bytes_in", &n.bytes_in);
    Read(record, "bytes_out", &n.bytes_out);
  } else if (kind == "error") {
    auto message = record.find("message");
    if (message == record.end() || !message->is_string()) {
      ++dropped_;
      return std::nullopt;
    }
    const std::string text = Clip(message->get<std::string>());
    if (n.errors.size() < kMaxErrorsPerNode) n.errors.push_back(text);
    if (errors_.size() < kMaxJobErrors) errors_.push_back(from.Name() + ": " + text);
  } else if (kind == "failure") {
    auto node = record.find("node");
    auto cause = record.find("cause");
    std::optional<NodeKey> key = node == record.end() ? std::nullopt : ParseNodeKey(*node);
    if (!key || cause == record.end() || !cause->is_string()) {
      ++dropped_;
      return std::nullopt;
    }
    FailureRecord f{*key, "", Clip(cause->get<std::string>()), from.Name()};
    if (node->contains("host") && (*node)["host"].is_string()) {
      f.host = Clip((*node)["host"].get<std::string>());
    }
    if (errors_.size() < kMaxJobErrors) errors_.push_back(f.Text());
    Node(*key).state = "failed";
    if (!first_failure_) first_failure_ = f;
    return f;
  } else if (kind == "member_rejoined") {
    // The scheduler's word that a replacement joined, and how long after its predecessor's loss.
    auto node = record.find("node");
    std::optional<NodeKey> key = node == record.end() ? std::nullopt : ParseNodeKey(*node);
    double seconds = 0;
    Read(record, "seconds", &seconds);
    if (!key) {
      ++dropped_;
      return std::nullopt;
    }
    NodeStatus& replaced = Node(*key);
    if (!replaced.restarts.empty()) {
      char text[64];
      std::snprintf(text, sizeof(text), "; rejoined %.2f s after the loss", seconds);
      replaced.restarts.back() += text;
    }
  } else if (kind == "rounds_lost") {
    // A server's word that a replaced worker's pushes of these rounds were lost with its own
    // process too (docs/reliability.md): they completed without them.
    int64_t worker = -1, first = 0, last = 0;
    Read(record, "worker", &worker);
    Read(record, "first", &first);
    Read(record, "last", &last);
    // Only a worker the job has: a malformed record adds no node.
    auto replaced = worker < 0 || worker > (int64_t{1} << 30)
                        ? nodes_.end()
                        : nodes_.find(NodeKey{Role::kWorker, static_cast<int>(worker)});
    if (replaced == nodes_.end() || first < 1 || last < first) {
      ++dropped_;
      return std::nullopt;
    }
    if (!replaced->second.restarts.empty()) {
      replaced->second.restarts.back() += "; rounds lost: " + std::to_string(first) + "-" +
                                          std::to_string(last) +
                                          " completed without its pushes to " + from.Name() +
                                          " (lost with that server's process too)";
    }
  } else if (kind == "checkpoint") {
    ++n.checkpoints;
    Read(record, "bytes", &n.checkpoint_bytes);
    Read(record, "ms", &n.checkpoint_ms);
    double cpu_ms = 0;
    if (Read(record, "cpu_ms", &cpu_ms) && cpu_ms >= 0 && cpu_ms < 1e9)
      n.checkpoint_cpu_ms += cpu_ms;
  } else if (kind == "push_log") {
    Read(record, "bytes", &n.push_log_bytes);
    Read(record, "copy_ms", &n.push_log_copy_ms);
    Read(record, "reserved_bytes", &n.push_log_reserved_bytes);
    Read(record, "reserve_ms", &n.push_log_reserve_ms);
  } else if (kind == "summary") {
    Read(record, "steps", &n.steps);
    Read(record, "samples", &n.samples);
    Read(record, "wait_s", &n.wait_s);
    Read(record, "active_s", &n.active_s);
    Read(record, "timed_samples", &n.timed_samples);
  }
  // "state", "heartbeat", "trace" and unknown kinds from a newer dtrain: heard of, nothing more.
  return std::nullopt;
}

std::optional<NodeKey> JobStatus::Straggler() const {
  const NodeStatus* slowest = nullptr;
  double fastest = 0;
  int reporting = 0;
  for (const auto& [key, n] : nodes_) {
    if (key.role != Role::kWorker || n.samples_per_s <= 0 || n.state != "running") continue;
    ++reporting;
    fastest = std::max(fastest, n.samples_per_s);
    if (slowest == nullptr || n.samples_per_s < slowest->samples_per_s) slowest = &n;
  }
  if (reporting < 2 || slowest->samples_per_s >= 0.9 * fastest) return std::nullopt;
  return slowest->key;
}

nlohmann::json JobStatus::ToJson(int64_t now_us) const {
  const std::optional<NodeKey> straggler = Straggler();
  nlohmann::json nodes = nlohmann::json::array();
  double total = 0;
  for (const auto& [key, n] : nodes_) {
    nlohmann::json j = {
        {"name", key.Name()},
        {"role", RoleName(key.role)},
        {"rank", key.rank},
        {"host", n.host},
        {"pid", n.pid},
        {"state", n.state},
        {"exit", n.exit},
        {"last_heard_s_ago", n.last_heard_us ? nlohmann::json((now_us - n.last_heard_us) / 1e6)
                                             : nlohmann::json(nullptr)},
        {"errors", n.errors},
        {"restarts", n.restarts},
        {"checkpoints", n.checkpoints},
        {"checkpoint_bytes", n.checkpoint_bytes},
        {"checkpoint_ms", n.checkpoint_ms},
        {"checkpoint_cpu_ms", n.checkpoint_cpu_ms}};
    if (key.role == Role::kWorker) {
      j["steps"] = n.steps;
      j["samples"] = n.samples;
      j["samples_per_s"] = n.samples_per_s;
      j["steps_per_s"] = n.steps_per_s;
      j["wait_s"] = n.wait_s;
      j["straggler"] = straggler && *straggler == key;
      j["push_log_bytes"] = n.push_log_bytes;  // reported as the worker leaves
      j["push_log_copy_ms"] = n.push_log_copy_ms;
      j["push_log_reserved_bytes"] = n.push_log_reserved_bytes;
      j["push_log_reserve_ms"] = n.push_log_reserve_ms;
      if (n.state == "running") total += n.samples_per_s;
    }
    if (key.role == Role::kServer) {
      j["bytes_in"] = n.bytes_in;
      j["bytes_out"] = n.bytes_out;
    }
    nodes.push_back(std::move(j));
  }
  nlohmann::json out = {{"elapsed_s", (now_us - start_us_) / 1e6},
                        {"samples_per_s", total},
                        {"nodes", std::move(nodes)},
                        {"errors", errors_},
                        {"resets", resets_},
                        {"dropped_records", dropped_}};
  if (first_failure_) {
    out["failure"] = {{"node", first_failure_->node.Name()},
                      {"host", first_failure_->host},
                      {"cause", first_failure_->cause},
                      {"reported_by", first_failure_->reporter}};
  }
  out["straggler"] = straggler ? nlohmann::json(straggler->Name()) : nlohmann::json(nullptr);
  return out;
}

std::vector<std::string> JobStatus::Summary(int64_t now_us) const {
  const double wall = (now_us - start_us_) / 1e6;
  std::vector<std::string> lines;
  lines.push_back("summary: wall time " + Seconds(wall));
  double total_rate = 0;
  int64_t total_samples = 0;
  for (const auto& [key, n] : nodes_) {
    if (key.role != Role::kWorker || n.samples == 0) continue;
    // Over the worker's time stepping (evaluation and saving between epochs left out), as its
    // progress lines measure it.
    const double rate = n.active_s > 0 ? n.timed_samples / n.active_s : 0;
    total_rate += rate;
    total_samples += n.samples;
    char text[256];
    const double wait_share = n.active_s > 0 ? 100.0 * n.wait_s / n.active_s : 0;
    std::snprintf(text, sizeof(text),
                  "  %s: %lld samples in %lld steps, %.1f samples/s; step time: %.0f%% compute, "
                  "%.0f%% waiting for communication",
                  key.Name().c_str(), static_cast<long long>(n.samples),
                  static_cast<long long>(n.steps), rate, 100.0 - wait_share, wait_share);
    lines.push_back(text);
  }
  if (total_samples > 0) {
    char text[128];
    std::snprintf(text, sizeof(text), "  all workers: %lld samples, %.1f samples/s",
                  static_cast<long long>(total_samples), total_rate);
    lines.push_back(text);
  }
  for (const auto& [key, n] : nodes_) {
    lines.push_back("  " + key.Name() + (n.host.empty() ? "" : " on " + n.host) + ": " +
                    (n.exit.empty() ? n.state : n.exit));
    for (const auto& r : n.restarts) lines.push_back("    restarted " + r);
    if (n.checkpoints > 0) {
      char text[160];
      std::snprintf(text, sizeof(text),
                    "    %lld checkpoint(s), the last %lld bytes in %.1f ms, %.1f ms of CPU in all",
                    static_cast<long long>(n.checkpoints),
                    static_cast<long long>(n.checkpoint_bytes), n.checkpoint_ms,
                    n.checkpoint_cpu_ms);
      lines.push_back(text);
    }
    if (n.push_log_bytes > 0) {
      char text[200];
      std::snprintf(text, sizeof(text), "    push log: %lld bytes copied into it in %.1f ms",
                    static_cast<long long>(n.push_log_bytes), n.push_log_copy_ms);
      std::string line = text;
      if (n.push_log_reserved_bytes > 0) {
        std::snprintf(text, sizeof(text), "; %lld bytes faulted in at the start in %.1f ms",
                      static_cast<long long>(n.push_log_reserved_bytes), n.push_log_reserve_ms);
        line += text;
      }
      lines.push_back(line);
    }
  }
  for (const auto& r : resets_) lines.push_back("  elastic " + r);
  if (first_failure_) {
    lines.push_back("  the job's cause: " + first_failure_->Text());
  }
  return lines;
}

}  // namespace dtrain::launcher

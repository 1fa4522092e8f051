// What the launcher knows about a running job: every node's state from the records the processes
// send (report/reporter.h) and the processes' starts and exits that it sees itself. The status
// page shows it, the end-of-job summary prints it, and failure records name the process a job
// failed for (instead of reading it out of a log line).
//
// Pure: the caller feeds records and events with the time, and asks. Records come from the
// network after their sender proved it knows the job's token, but are still checked field by
// field; a record that does not fit is counted and dropped.
//
// Threads: one (the launcher's event loop).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/config/config.h"

namespace dtrain::launcher {

// A node as records name it.
struct NodeKey {
  Role role = Role::kWorker;
  int rank = 0;
  auto operator<=>(const NodeKey&) const = default;
  std::string Name() const;  // "scheduler", "server 0", "worker 1"
};

// A process the job failed for, as the process that saw it happen reports it.
struct FailureRecord {
  NodeKey node;
  std::string host;
  std::string cause;     // "its connection closed (the process exited or died)"
  std::string reporter;  // "scheduler", "worker 0"

  // "worker 1 failed: CAUSE (reported by the scheduler)"
  std::string Text() const;
};

struct NodeStatus {
  NodeKey key;
  std::string host;
  int64_t pid = 0;
  // "starting" (launched, not heard of), "running", "finished" (exited 0), "failed"
  std::string state = "starting";
  std::string exit;           // "exited with code 1", once it has
  int64_t last_heard_us = 0;  // launcher clock; 0: never
  // Workers: the latest progress.
  int64_t steps = 0;
  int64_t samples = 0;
  double samples_per_s = 0;  // over the last reporting window
  double steps_per_s = 0;
  // Since the start: samples of timed steps, the time they took, and the time blocked waiting
  // for communication in them (parameter_sync.h).
  int64_t timed_samples = 0;
  double active_s = 0;
  double wait_s = 0;
  // Servers: traffic since the start.
  int64_t bytes_in = 0;
  int64_t bytes_out = 0;
  std::vector<std::string> errors;
  // Replacements started for it (dtrain launch --max-restarts): "at 12.3 s: killed by signal 9;
  // rejoined 1.8 s later".
  std::vector<std::string> restarts;
  // Servers with DTRAIN_CHECKPOINT_DIR: checkpoints written, the last one's size and time, and
  // the CPU time they all took.
  int64_t checkpoints = 0;
  int64_t checkpoint_bytes = 0;
  double checkpoint_ms = 0;
  double checkpoint_cpu_ms = 0;
  // Workers keeping their pushes for restored servers: bytes copied into the log, and the time.
  int64_t push_log_bytes = 0;
  double push_log_copy_ms = 0;
  int64_t push_log_reserved_bytes = 0;  // faulted in at the start, and how long that took
  double push_log_reserve_ms = 0;
};

class JobStatus {
 public:
  explicit JobStatus(int64_t start_us) : start_us_(start_us) {}

  // The launcher started `key` on `host` as local process `pid` (a client's pid for ssh).
  void ProcessStarted(const NodeKey& key, const std::string& host, int64_t pid, int64_t now_us);
  // It exited: `description` as the launcher says it ("exited with code 1").
  void ProcessExited(const NodeKey& key, bool succeeded, const std::string& description,
                     int64_t now_us);

  // Its process failed ("killed by signal 9") and the launcher started a replacement.
  void ProcessRestarted(const NodeKey& key, const std::string& why, int64_t pid, int64_t now_us);
  // An elastic job's membership changed (elastic_job.h): "membership 2: 2 rank(s): worker 0,
  // worker 2", or a worker's failure that retired its slot. Kept in order, the first 1000.
  void JobReset(const std::string& what, int64_t now_us);
  // One record from a process that said hello as `from`. Returns the failure it reports, if it
  // is one. Records that do not fit are counted (dropped()).
  std::optional<FailureRecord> Apply(const NodeKey& from, const nlohmann::json& record,
                                     int64_t now_us);

  // An elastic job went on without the failed worker: its failure is no longer the job's cause.
  void ForgetFailure() { first_failure_.reset(); }
  // The first failure reported, if any.
  const std::optional<FailureRecord>& first_failure() const { return first_failure_; }
  // The worker with the lowest samples/s when it is more than 10% below the fastest.
  std::optional<NodeKey> Straggler() const;

  // Everything, for /api/status.
  nlohmann::json ToJson(int64_t now_us) const;
  // The end-of-job summary: wall time, samples/s per worker and in total, each process's exit,
  // where the workers' step time went. Lines without a trailing newline.
  std::vector<std::string> Summary(int64_t now_us) const;

  uint64_t dropped() const { return dropped_; }
  const std::map<NodeKey, NodeStatus>& nodes() const { return nodes_; }

 private:
  NodeStatus& Node(const NodeKey& key);

  int64_t start_us_;
  std::map<NodeKey, NodeStatus> nodes_;
  std::optional<FailureRecord> first_failure_;
  std::vector<std::string> errors_;  // "worker 1: ..." in arrival order
  std::vector<std::string> resets_;  // "at 12.3 s: membership 2: ...", in order
  uint64_t dropped_ = 0;
};

// "worker" -> Role::kWorker etc.; nullopt for anything else.
std::optional<NodeKey> ParseNodeKey(const nlohmann::json& object);

}  // namespace dtrain::launcher

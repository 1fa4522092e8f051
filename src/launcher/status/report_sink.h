// What the launcher does with what the job's processes report (report/reporter.h): keeps the
// job's status (job_status.h), serves it (status_page.h), collects timeline events and merges them
// into one trace, and prints the end-of-job summary. Owned by the job's event loop (watch_loop.h).
//
// The merged timeline (DTRAIN_TIMELINE or HOROVOD_TIMELINE in the launcher's environment) is
// Chrome's trace format: one "process" per node, named ("worker 1") and ordered (scheduler,
// servers, workers), every event on the launcher's clock (each process measured its offset when
// it connected).
//
// Threads: the launcher's event loop.
#pragma once

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/status/job_status.h"
#include "launcher/status/report_server.h"
#include "launcher/status/status_page.h"

namespace dtrain::launcher {

struct ReportOptions {
  std::optional<uint16_t> status_port;    // --status-port
  std::string status_host = "127.0.0.1";  // --status-host
  Duration status_linger{0};  // --status-linger-s: keep serving the page after the job ended
  std::string timeline_path;  // where to merge the timeline; "" for none
  int num_servers = 0;        // the processes' ids in the trace count on it (timeline.h)
  bool summary = true;        // print the end-of-job summary
};

class JobReports {
 public:
  using SayFn = std::function<void(const std::string&)>;

  // Starts serving `channel` (and the status page). Throws dtrain::Error when the status page's
  // port cannot be bound.
  JobReports(asio::io_context& io, ReportChannel channel, const ReportOptions& options, SayFn say);
  ~JobReports();

  JobStatus& status() { return status_; }
  // Called with every failure record as it arrives (the first one names the job's cause).
  void set_on_failure(std::function<void(const FailureRecord&)> fn) { on_failure_ = std::move(fn); }
  // Called with the node the scheduler lost by its silence (a "member_lost" record with
  // "silent_ms": the job waits for its replacement, and its process may still run), why, and how
  // long it had been silent. Only the scheduler's records count.
  using MemberLostFn = std::function<void(const NodeKey&, const std::string&, Duration)>;
  void set_on_silent_member_lost(MemberLostFn fn) { on_silent_member_lost_ = std::move(fn); }
  // Requests of the processes (report_server.h's RequestFn).
  void set_on_request(ReportServer::RequestFn fn) { server_->set_on_request(std::move(fn)); }

  // Something the launcher did to the job (a replacement started, an elastic membership formed, a
  // slot retired): a global instant event of the "dtrain launch" row of the merged timeline,
  // when there is one. `category`: "restart" or "elastic".
  void MarkTimeline(const std::string& category, const std::string& what);

  // The job is over: stops listening, writes the timeline, prints the summary. Returns how long
  // the status page should still be served (the event loop keeps running for it).
  Duration Finish();
  // The linger is over: stops the status page.
  void Close();

 private:
  void OnRecord(const NodeKey& from, const nlohmann::json& record);
  void WriteTimeline();
  int TraceId(const NodeKey& node) const;

  ReportOptions options_;
  SayFn say_;
  JobStatus status_;
  std::unique_ptr<ReportServer> server_;
  std::unique_ptr<StatusPage> page_;
  std::function<void(const FailureRecord&)> on_failure_;
  MemberLostFn on_silent_member_lost_;
  // Per node, its batches of events as it sent them (JSON text without the brackets).
  std::map<NodeKey, std::vector<std::string>> trace_;
  std::map<NodeKey, size_t> trace_bytes_;
  std::vector<std::string> marks_;  // MarkTimeline's events, as JSON text
  bool finished_ = false;
};

}  // namespace dtrain::launcher

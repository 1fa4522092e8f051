#include "launcher/status/report_sink.h"

#include <fstream>

#include "dtrain/common/error.h"

namespace dtrain::launcher {
namespace {

// Timeline text kept per node at most: a long job's timeline is cut rather than fill the
// launcher's memory.
constexpr size_t kMaxTraceBytesPerNode = size_t{512} << 20;

}  // namespace

JobReports::JobReports(asio::io_context& io, ReportChannel channel, const ReportOptions& options,
                       SayFn say)
    : options_(options), say_(std::move(say)), status_(NowMicros()) {
  server_ = std::make_unique<ReportServer>(
      io, std::move(channel),
      [this](const NodeKey& from, const nlohmann::json& record) { OnRecord(from, record); },
      [this](const NodeKey& from, std::string_view batch) {
        if (finished_ || options_.timeline_path.empty() || batch.size() <= 2) return;
        size_t& bytes = trace_bytes_[from];
        if (bytes + batch.size() > kMaxTraceBytesPerNode) return;
        bytes += batch.size();
        trace_[from].emplace_back(batch.substr(1, batch.size() - 2));
      },
      say_);
  if (options_.status_port) {
    page_ = std::make_unique<StatusPage>(io, options_.status_host, *options_.status_port,
                                         [this] { return status_.ToJson(NowMicros()); });
    say_("status page at http://" + options_.status_host + ":" + std::to_string(page_->port()) +
         "/ (JSON: /api/status)");
  }
}

JobReports::~JobReports() = default;

void JobReports::OnRecord(const NodeKey& from, const nlohmann::json& record) {
  if (finished_) return;
  if (auto failure = status_.Apply(from, record, NowMicros()); failure && on_failure_) {
    on_failure_(*failure);
  }
  if (on_silent_member_lost_ && from.role == Role::kScheduler &&
      record.value("kind", "") == "member_lost") {
    auto node = record.find("node");
    std::optional<NodeKey> key = node == record.end() ? std::nullopt : ParseNodeKey(*node);
    auto cause = record.find("cause");
    auto silent = record.find("silent_ms");
    if (key && cause != record.end() && cause->is_string() && silent != record.end() &&
        silent->is_number_unsigned()) {
      on_silent_member_lost_(*key, cause->get<std::string>(), Duration(silent->get<int64_t>()));
    }
  }
}

Duration JobReports::Finish() {
  if (finished_) return Duration(0);
  finished_ = true;
  server_->Stop();
  if (!options_.timeline_path.empty()) WriteTimeline();
  if (options_.summary) {
    for (const std::string& line : status_.Summary(NowMicros())) say_(line);
  }
  if (!page_) return Duration(0);
  if (options_.status_linger.count() > 0) {
    say_("the status page stays up for " + std::to_string(options_.status_linger.count() / 1000) +
         " s (--status-linger-s)");
  }
  return options_.status_linger;
}

void JobReports::Close() {
  if (page_) page_->Stop();
}

// The id a node gives its events (timeline.cc): scheduler 0, server r 1 + r, worker r
// 1 + servers + r.
// The launcher's own row (MarkTimeline): after every node's id, sorted first.
constexpr int kLauncherTraceId = 1 << 30;

int JobReports::TraceId(const NodeKey& node) const {
  switch (node.role) {
    case Role::kScheduler:
      return 0;
    case Role::kServer:
      return 1 + node.rank;
    case Role::kWorker:
      break;
  }
  return 1 + options_.num_servers + node.rank;
}

void JobReports::MarkTimeline(const std::string& category, const std::string& what) {
  if (options_.timeline_path.empty() || finished_ || marks_.size() >= 10000) return;
  marks_.push_back(nlohmann::json{{"name", what},
                                  {"cat", category},
                                  {"ph", "i"},
                                  {"s", "g"},
                                  {"ts", NowMicros()},
                                  {"pid", kLauncherTraceId}}
                       .dump());
}

void JobReports::WriteTimeline() {
  std::ofstream out(options_.timeline_path);
  out << "{\"traceEvents\":[";
  bool first = true;
  auto put = [&](const std::string& text) {
    out << (first ? "\n" : ",\n") << text;
    first = false;
  };
  size_t bytes = 0;
  for (const auto& [node, batches] : trace_) {
    const int pid = TraceId(node);
    put(nlohmann::json{
        {"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", node.Name()}}}}
            .dump());
    put(nlohmann::json{
        {"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}}
            .dump());
    for (const std::string& batch : batches) {
      put(batch);
      bytes += batch.size();
    }
  }
  if (!marks_.empty()) {
    put(nlohmann::json{{"name", "process_name"},
                       {"ph", "M"},
                       {"pid", kLauncherTraceId},
                       {"args", {{"name", "dtrain launch"}}}}
            .dump());
    put(nlohmann::json{{"name", "process_sort_index"},
                       {"ph", "M"},
                       {"pid", kLauncherTraceId},
                       {"args", {{"sort_index", -1}}}}
            .dump());
    for (const std::string& mark : marks_) put(mark);
  }
  out << "\n],\"displayTimeUnit\":\"ms\"}\n";
  if (!out) {
    say_("cannot write the timeline " + options_.timeline_path);
    return;
  }
  say_("timeline of " + std::to_string(trace_.size()) + " processes (" +
       std::to_string(bytes >> 10) + " KiB of events) in " + options_.timeline_path);
}

}  // namespace dtrain::launcher

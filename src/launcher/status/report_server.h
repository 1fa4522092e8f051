// Where the launcher hears from the job's processes (report/reporter.h).
//
// The channel is opened before the job's plan is made (its port and a fresh random token go into
// every process's environment: DTRAIN_REPORT_ADDR, DTRAIN_REPORT_TOKEN), and served by the
// launcher's event loop while the job runs. A connection must start with a hello line that holds
// the token (compared in constant time) and names a node; it gets the launcher's clock back and
// may then send records, one JSON object a line, and batches of timeline events, one JSON array a
// line, which are kept as text. Anything else (no hello within 5 s, a wrong token, a hello over
// 4 KiB, a line over 64 MiB, text that is not a JSON object) closes the connection and is logged,
// at most a few times: a stranger never counts as a process of the job, nor holds more than 4 KiB
// of the launcher's memory.
//
// Threads: the launcher's event loop.
#pragma once

#include <asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "launcher/plan/job_plan.h"
#include "launcher/run/process_group.h"
#include "launcher/status/job_status.h"

namespace dtrain::launcher {

struct ReportChannel {
  UniqueFd listener;  // bound and listening
  uint16_t port = 0;
  std::string token;  // 32 hex digits from the system's random source

  // Listens on 127.0.0.1 (a job on this machine) or every interface (other hosts report too).
  // Throws dtrain::Error.
  static ReportChannel Open(bool loopback_only);
};

// Adds DTRAIN_REPORT_ADDR=address:port and DTRAIN_REPORT_TOKEN to every process of `plan`
// (before the user's --env, which may override them).
void TellProcesses(JobPlan* plan, const std::string& address, const ReportChannel& channel);

class ReportServer {
 public:
  // `on_record` gets every record of every process that said hello, with the node it said it is.
  using RecordFn = std::function<void(const NodeKey& from, const nlohmann::json& record)>;
  // Lines of JSON text that start with '[' (a batch of timeline events), kept unparsed.
  using TextFn = std::function<void(const NodeKey& from, std::string_view line)>;
  // `say` writes a line about a refused connection ("dtrain launch: ...").
  using SayFn = std::function<void(const std::string&)>;
  // Answers a request on the connection it came on (a JSON object, one line); does nothing once
  // that connection is closed.
  using ReplyFn = std::function<void(const nlohmann::json& answer)>;
  // Records whose "kind" starts with "elastic_" are requests (collectives/elastic): they go here
  // instead of to on_record, with the address the connection came from.
  using RequestFn = std::function<void(const NodeKey& from, const std::string& peer_address,
                                       const nlohmann::json& request, ReplyFn reply)>;

  ReportServer(asio::io_context& io, ReportChannel channel, RecordFn on_record, TextFn on_text,
               SayFn say);
  ~ReportServer();

  // Stops accepting and closes every connection.
  void Stop();
  void set_on_request(RequestFn fn);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The launcher's clock, as records and timelines use it: microseconds of system_clock.
int64_t NowMicros();

}  // namespace dtrain::launcher

// `dtrain launch --status-port PORT`: a live view of the job over HTTP, served by the launcher's
// event loop while the job runs.
//
//   GET /             an HTML page that refreshes itself every second: every node (role, rank,
//                     host, pid, state, when it was last heard of), each worker's step rate and
//                     samples/s with the straggler marked, each server's traffic, and the errors
//                     as they happen
//   GET /api/status   the same as JSON (JobStatus::ToJson)
//
// It binds 127.0.0.1 unless --status-host says otherwise. Requests are read with a deadline
// (5 s) and a size limit (16 KiB); anything but these two GETs is answered 404 or 400.
//
// Threads: the launcher's event loop.
#pragma once

#include <asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace dtrain::launcher {

class StatusPage {
 public:
  // `status` gives the current JSON. Throws dtrain::Error when the port cannot be bound.
  StatusPage(asio::io_context& io, const std::string& host, uint16_t port,
             std::function<nlohmann::json()> status);
  ~StatusPage();

  uint16_t port() const;  // the one bound (PORT 0: the kernel's choice)
  void Stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The page itself (static: it fetches /api/status).
const std::string& StatusHtml();

}  // namespace dtrain::launcher

// One connection to `dtrain launch`'s report port (DTRAIN_REPORT_ADDR): connect, hello with the
// job's report token (DTRAIN_REPORT_TOKEN) and this process's identity, then JSON lines both ways.
// The reporter (reporter.h) sends its records over one; the elastic membership
// (collectives/elastic) asks the launcher for its rank over another and reads the answers.
//
// Every call has a deadline; a line from the launcher longer than the caller's bound is a
// ProtocolError, never a larger buffer.
//
// Threads: one caller at a time.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "dtrain/common/deadline.h"

namespace dtrain::report {

class LauncherLink {
 public:
  // Connects to `address` ("host:port") and says hello: `identity` (role, rank, host, pid) plus
  // "kind":"hello" and the token. Waits at most `timeout` in all. Throws PeerError (cannot
  // resolve, refused, closed: the launcher refused the token) or TimeoutError, naming `address`.
  LauncherLink(const std::string& address, const std::string& token, nlohmann::json identity,
               Duration timeout);
  ~LauncherLink();
  LauncherLink(const LauncherLink&) = delete;
  LauncherLink& operator=(const LauncherLink&) = delete;

  // What the launcher answered to the hello: {"now_us": its clock}.
  const nlohmann::json& hello_reply() const { return hello_reply_; }

  // Writes `data` (lines ending in '\n'). Throws PeerError when the connection is lost,
  // TimeoutError when the launcher reads nothing for `timeout`.
  void Write(const std::string& data, Duration timeout);
  // Writes one JSON object as a line.
  void Send(const nlohmann::json& record, Duration timeout) {
    Write(record.dump() + "\n", timeout);
  }
  // Reads the next line as a JSON object. Throws TimeoutError after `timeout`, PeerError when the
  // launcher closes the connection, ProtocolError for a line over `max_bytes` or not an object.
  nlohmann::json Receive(Duration timeout, size_t max_bytes = 64 * 1024);

  const std::string& address() const { return address_; }

 private:
  bool WaitFor(short events, const Deadline& deadline);

  std::string address_;
  int fd_ = -1;
  std::string pending_;  // bytes read past the last line
  nlohmann::json hello_reply_;
};

}  // namespace dtrain::report

// RawPeer: a bare in-memory transport with an inbox, for tests that play a node of a job by hand
// (a scheduler that writes its own node table, a worker that sends crafted data messages, a node
// that claims to be someone it is not).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/common/deadline.h"
#include "support/transport/inmemory_transport.h"

namespace dtrain::testing {

class RawPeer {
 public:
  // `id` is stamped as the sender of everything this peer sends.
  RawPeer(std::shared_ptr<transport::InMemoryNetwork> network, transport::NodeId id);
  ~RawPeer();

  uint16_t Listen();
  void Connect(transport::NodeId peer, uint16_t port, Duration timeout = Duration(2000));
  // Stamps sender and recipient (unless the message sets a sender of its own) and sends.
  void Send(transport::NodeId to, transport::Message msg, bool keep_sender = false);

  // Takes the first message `match` accepts out of the inbox, waiting up to `timeout`.
  std::optional<transport::Message> Take(
      const std::function<bool(const transport::Message&)>& match,
      Duration timeout = Duration(5000));
  std::optional<transport::Message> TakeCommand(transport::Command command,
                                                Duration timeout = Duration(5000));
  std::optional<transport::Message> TakeReply(uint64_t request_id,
                                              Duration timeout = Duration(5000));
  // Peers the transport reported lost so far, as "id: reason".
  std::vector<std::string> lost() const;

  transport::NodeId id() const { return id_; }
  uint16_t port() const { return transport_->port(); }

 private:
  const transport::NodeId id_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<transport::Message> inbox_;
  std::vector<std::string> lost_;
  std::unique_ptr<transport::InMemoryTransport> transport_;  // last: stops before the inbox goes
};

// A message body holding `values` (float32).
transport::Body FloatBody(const std::vector<float>& values);
// A body of `bytes` zero bytes.
transport::Body ZeroBody(size_t bytes);
std::vector<float> Floats(const transport::Body& body);

}  // namespace dtrain::testing

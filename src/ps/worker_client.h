// WorkerClient: a worker's requests to servers and the routing of their replies.
//
// Each request gets an id; the reply with that id calls the request's callback, once, on a
// transport thread. A pull's reply body is read straight into the destination the caller gave
// (the caller's array), so a pulled value is copied once, by the kernel. When the job fails every
// outstanding request is failed with the node's failure (naming the peer), and new requests fail
// at once.
//
// Threads: all methods are thread-safe.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "ps/node/node.h"
#include "transport/message.h"

namespace dtrain::ps {

class WorkerClient {
 public:
  // reply is null when error is set.
  using Done = std::function<void(const transport::Message* reply, std::exception_ptr error)>;

  // Installs itself as the node's data handler; call before node.Start().
  explicit WorkerClient(Node& node);

  // Sends `request` to server `server_rank`. If `reply_into` has data, a reply body of exactly
  // that size is written there (the reply passed to `done` then points at it). Never throws: a
  // failure to send is reported through `done`.
  void Request(int server_rank, transport::Message request, transport::Body reply_into, Done done);

 private:
  struct Pending {
    int server = 0;
    transport::Body reply_into;
    Done done;
  };

  transport::Body SinkFor(const transport::Header& header, size_t bytes);
  void OnReply(transport::Message&& msg);
  void FailAll(const std::string& why);

  Node& node_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex mutex_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::optional<std::string> failure_;
};

}  // namespace dtrain::ps

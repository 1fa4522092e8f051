// WorkerClient: a worker's requests to servers and the routing of their replies.
//
// Each request gets an id; the reply with that id calls the request's callback, once, on a
// transport thread. A pull's reply body is read straight into the destination the caller gave
// (the caller's array), so a pulled value is copied once, by the kernel. When the job fails every
// outstanding request is failed with the node's failure (naming the peer), and new requests fail
// at once.
//
// A lost server's replacement (Config::ServersReplaceable, server.h): from the moment the worker
// hears of it (Hold) the requests for that server wait here, unsent, with those it never answered;
// once it has started, Resume sends them again in their order, after the pushes it lost since its
// checkpoint (kept in a PushLog, EnableReplay): every slot then sees this worker's pushes in the
// order they were made, with no round missing or counted twice.
//
// Threads: all methods are thread-safe.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "ps/node/node.h"
#include "ps/push_log.h"
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
  // `log_push`: a dist_sync push or pushpull, kept for a restored server (EnableReplay; its body
  // must be the worker's own buffer, not the caller's array).
  void Request(int server_rank, transport::Message request, transport::Body reply_into, Done done,
               bool log_push = false);

  // Keeps what Resume needs: the requests themselves and (sync stores) the pushes since each
  // server's last checkpoint, up to bound_bytes. Call before the first request.
  void EnableReplay(size_t bound_bytes, bool log_pushes);
  // A replacement worker: the slot's rounds so far (its lost process pushed them to `server`).
  void StartLogAt(int server, uint64_t key, uint32_t part, int64_t rounds);
  // Whether this process has logged a push to `server_rank` (false without a push log).
  bool LoggedPushTo(int server_rank);
  // Server `server_rank` was lost and its replacement is coming: requests for it wait.
  void Hold(int server_rank);
  // The replacement restored these rounds; sends it what it lacks, then lets requests through.
  // Fails every request (and the client) if the log cannot cover the rounds.
  void Resume(int server_rank, const std::map<std::pair<uint64_t, uint32_t>, int64_t>& restored);
  // Sends to a held server (Resume's own question to it); otherwise as Request.
  void RequestPastHold(int server_rank, transport::Message request, Done done);
  // Fails every outstanding request and all later ones with `why`.
  void FailAll(const std::string& why);

 private:
  struct Pending {
    int server = 0;
    transport::Body reply_into;
    Done done;
    transport::Message request;  // kept with EnableReplay, to be sent again
    int64_t round = 0;           // a logged push's round in its slot, else 0
  };

  transport::Body SinkFor(const transport::Header& header, size_t bytes);
  void OnReply(transport::Message&& msg);
  // A server's word that is no answer: "checkpointed" (its slots' rounds).
  void OnServerNotice(const transport::Message& msg);
  void Issue(int server_rank, transport::Message request, transport::Body reply_into, Done done,
             bool log_push, bool past_hold);
  // Hands the request to the node; a failure fails it, unless a replacement may take it.
  void Send(int server_rank, uint64_t id, transport::Message request);
  // A checkpoint newer than `heard` (the server's last this worker heard of; 0: any).
  void AskForCheckpoint(int server_rank, uint64_t heard);

  Node& node_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex mutex_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::optional<std::string> failure_;
  // Held shared from a request's check of held_ to its send; Hold and Resume hold it exclusively.
  std::shared_mutex send_mutex_;
  std::atomic<bool> keep_requests_{false};
  std::unique_ptr<PushLog> log_;  // sync stores with EnableReplay
  std::set<int> held_;            // servers whose replacement is coming
};

}  // namespace dtrain::ps

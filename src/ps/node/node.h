// Node: a server's or worker's membership in a job.
//
// It registers with the scheduler, learns every node's id, rank and address, connects to the peers
// its role talks to (workers <-> servers), and from then on provides barriers, heartbeats, failure
// detection and an orderly end. Data messages (init, push, pull, ...) are passed through to the
// handler the role installs.
//
// Failure model: the first failure (a peer lost, a failure reported by the scheduler, the
// scheduler gone silent) is recorded once, logged at once with the peer's name, and handed to the
// failure listeners (which fail pending requests); every later call throws PeerError with it.
// With Options::exit_on_failure (real processes), the process exits with code 1 if it is still
// running DTRAIN_FAILURE_EXIT_MS after the failure, so nothing lingers even if the program is busy
// elsewhere and never calls dtrain again.
//
// Threads: Start, Barrier, Finish, WaitForTermination and Shutdown block the caller and may be
// called from any one thread; Send and the accessors are thread-safe. All but WaitForTermination
// have a deadline. WaitForTermination waits as long as the job runs, with no deadline of its own:
// the scheduler's kTerminate ends it, and so does the first failure (a lost peer, the scheduler's
// report of one or its abort, or the scheduler silent past PS_HEARTBEAT_TIMEOUT, which the
// heartbeat thread notices), so failure detection bounds it.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/config/config.h"
#include "ps/node/node_info.h"
#include "transport/transport.h"

namespace dtrain::ps {

class Node {
 public:
  struct Options {
    bool exit_on_failure = false;
  };

  Node(const Config& config, Role role, std::unique_ptr<transport::Transport> transport,
       Options options);
  ~Node();

  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Set before Start. The handler gets data messages on transport threads.
  void SetDataHandler(transport::MessageHandler handler, transport::BodySink sink = {});
  // Servers: the most bytes each incoming message's body may have (transport.h BodyLimit); set
  // before Start.
  void SetBodyLimit(transport::BodyLimit limit);
  // Servers: called (on a transport thread) when the scheduler says a worker left the job early.
  void SetWorkerFinishedHandler(std::function<void(int worker_rank)> handler);
  // Servers: called when a lost worker's replacement is about to connect (DTRAIN_RESTART_WAIT_MS),
  // before this server connects to it; what the lost process left behind must go.
  void SetWorkerReplacedHandler(std::function<void(int worker_rank)> handler);
  // Servers, when workers are replaceable: called (on a transport thread) when a worker is lost
  // and the job waits for its replacement. May be called more than once for one loss.
  void SetWorkerLostHandler(std::function<void(int worker_rank)> handler);
  // Workers, when servers are replaceable (Config::ServersReplaceable): `replaced` is called when a
  // lost server's replacement is about to be connected to (before it is), `restarted` once the
  // scheduler has started it (it restored its checkpoint and connected to every worker), on a
  // thread of its own that may block (bounded).
  void SetServerReplacedHandlers(std::function<void(int server_rank)> replaced,
                                 std::function<void(int server_rank)> restarted);
  // Called (on the caller of Start) once the node table is in, before any peer is connected to;
  // an exception from it fails Start.
  void SetJoinedHandler(std::function<void()> handler);
  // Called once, on the first failure, from whichever thread found it.
  void AddFailureListener(std::function<void(const std::string& why)> listener);

  // Joins the job. Throws TimeoutError (scheduler unreachable, job never complete), PeerError
  // (the scheduler aborted the job) or ConfigError.
  void Start();

  const NodeInfo& self() const { return self_; }
  // This process replaces a lost member of a running job (the scheduler said so).
  bool rejoined() const { return rejoined_; }
  // A replacement: how many of the workers' setup barriers (Barrier's `setup`) the job had
  // completed when it joined; 0 for the job's first processes.
  uint64_t setup_barriers_before_joining() const;
  const JobLayout& layout() const { return layout_; }
  const Config& config() const { return config_; }
  // "server 1 (10.0.0.2:4000)"; a plain description for ids not in the table.
  std::string NameOf(NodeId id) const;

  // Stamps sender and recipient and queues the message. Throws PeerError after a failure.
  void Send(NodeId to, transport::Message msg);

  // Blocks until every node of the group has arrived. Throws PeerError / TimeoutError. `setup`:
  // the barrier of a KVStore setup step (control.h's EncodeBarrier).
  void Barrier(Group group, bool setup = false);

  std::optional<std::string> failure() const;
  void ThrowIfFailed() const;

  // Worker: tells the scheduler this worker is done and waits until the job ends.
  void Finish();
  // Server: blocks until the job ends (returns 0) or fails (logs and returns 1); no deadline, see
  // Threads above.
  int WaitForTermination();
  // Says goodbye to every peer and stops the transport. Idempotent.
  void Shutdown();

 private:
  void OnMessage(transport::Message&& msg);
  void OnControl(transport::Message&& msg);
  void OnPeerLost(NodeId peer, const std::string& remote, const std::string& reason);
  void Fail(const std::string& why);
  void HeartbeatLoop();
  // Waits until pred() (mutex_ held) or a failure; throws PeerError / TimeoutError(what).
  void WaitUntil(const std::function<bool()>& pred, const Deadline& deadline,
                 const std::string& what);
  void SendControl(transport::Command command, std::string meta = {});
  // A replaced peer (a worker's for a server, a server's for a worker); connects to it (on a
  // thread of its own) and tells the scheduler.
  void OnNodeReplaced(const std::string& meta);
  // Connects to peer `id` at the address the node table has for it, read again every
  // kTableRecheck: a peer lost while a replacement starts gets a replacement of its own, at
  // another address (OnNodeReplaced updates the table). Throws TimeoutError at the deadline.
  void ConnectToPeer(NodeId id, const Deadline& deadline);
  void ConnectToReplacement(NodeInfo replacement);
  // Workers: the scheduler started a lost server's replacement (meta: its id).
  void OnReplacementStarted(const std::string& meta);

  const Config config_;
  const Role role_;
  const Options options_;
  std::unique_ptr<transport::Transport> transport_;
  transport::MessageHandler data_handler_;
  transport::BodySink body_sink_;
  transport::BodyLimit body_limit_;
  std::vector<std::function<void(const std::string&)>> failure_listeners_;
  std::function<void(int)> worker_finished_;
  std::function<void(int)> worker_replaced_;
  std::function<void(int)> worker_lost_;
  std::function<void(int)> server_replaced_;
  std::function<void(int)> server_restarted_;
  std::function<void()> joined_;

  NodeInfo self_;
  JobLayout layout_;
  // Indexed by id, set at Start; a replaced worker's entry changes later (table_mutex_).
  std::vector<NodeInfo> table_;
  mutable std::mutex table_mutex_;
  bool rejoined_ = false;
  std::vector<std::thread> replacement_connectors_;  // joined at Shutdown

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool have_table_ = false;
  bool started_ = false;
  bool terminated_ = false;
  bool shut_down_ = false;
  std::optional<std::string> failure_;
  std::map<Group, uint64_t> barrier_done_;  // group -> barriers completed
  std::map<Group, uint64_t> barrier_sent_;
  uint64_t setup_barriers_before_joining_ = 0;  // set by kRejoin, before Start returns
  Clock::time_point last_heard_from_scheduler_;
  // A worker or server whose link closed; a failure unless the job ends before the deadline.
  std::optional<std::string> pending_loss_;
  Clock::time_point pending_loss_deadline_;
  std::thread heartbeat_;
};

}  // namespace dtrain::ps

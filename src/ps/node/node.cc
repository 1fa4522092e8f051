#include "ps/node/node.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/logging.h"
#include "common/net_address.h"
#include "dtrain/common/error.h"
#include "ps/node/control.h"
#include "ps/node/listen_address.h"
#include "report/reporter.h"

namespace dtrain::ps {

using transport::Command;
using transport::Message;

namespace {

// How long a lost worker or server link waits for the job's end before it fails the node (see
// OnPeerLost): far longer than a kTerminate takes to arrive, short enough to fail within seconds.
constexpr Duration kPeerLossGrace{2000};
// How often a connection attempt made at startup reads the peer's address again (ConnectToPeer).
constexpr Duration kTableRecheck{1000};

bool IsControl(Command c) {
  return static_cast<uint16_t>(c) < static_cast<uint16_t>(Command::kInit);
}

// The first failure of a node of this process, for the exit below.
std::mutex g_failed_mutex;
std::string g_failed_why;

// Runs at exit (glibc's on_exit, which passes the status): a process whose node saw its job fail
// must not report success, whatever its program did with the error (caught it, logged it, or
// never called dtrain again). Other exit codes are the program's own and stay.
void NeverExitZeroAfterAFailure(int status, void*) {
  if (status != 0) return;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(g_failed_mutex);
    why = g_failed_why;
  }
  report::Flush(std::chrono::milliseconds(500));
  LogLine(LogLevel::kError, "exiting with code 1, not 0: the job failed (" + why + ")");
  std::fflush(nullptr);
  std::_Exit(1);
}

void ExitNonZeroFromNowOn(const std::string& why) {
  std::lock_guard<std::mutex> lock(g_failed_mutex);
  if (!g_failed_why.empty()) return;
  g_failed_why = why;
  ::on_exit(&NeverExitZeroAfterAFailure, nullptr);
}

}  // namespace

Node::Node(const Config& config, Role role, std::unique_ptr<transport::Transport> transport,
           Options options)
    : config_(config), role_(role), options_(options), transport_(std::move(transport)) {
  self_.role = role;
  layout_.num_servers = config.num_servers;
  layout_.num_workers = config.num_workers;
}

Node::~Node() { Shutdown(); }

void Node::SetDataHandler(transport::MessageHandler handler, transport::BodySink sink) {
  data_handler_ = std::move(handler);
  body_sink_ = std::move(sink);
}

void Node::SetBodyLimit(transport::BodyLimit limit) { body_limit_ = std::move(limit); }

void Node::SetWorkerFinishedHandler(std::function<void(int)> handler) {
  worker_finished_ = std::move(handler);
}

void Node::SetWorkerReplacedHandler(std::function<void(int)> handler) {
  worker_replaced_ = std::move(handler);
}

void Node::SetWorkerLostHandler(std::function<void(int)> handler) {
  worker_lost_ = std::move(handler);
}

void Node::SetServerReplacedHandlers(std::function<void(int)> replaced,
                                     std::function<void(int)> restarted) {
  server_replaced_ = std::move(replaced);
  server_restarted_ = std::move(restarted);
}

void Node::SetJoinedHandler(std::function<void()> handler) { joined_ = std::move(handler); }

void Node::AddFailureListener(std::function<void(const std::string&)> listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  failure_listeners_.push_back(std::move(listener));
}

std::string Node::NameOf(NodeId id) const {
  {
    std::lock_guard<std::mutex> lock(table_mutex_);
    if (id >= 0 && static_cast<size_t>(id) < table_.size() && started_) return table_[id].Name();
  }
  if (id == transport::kSchedulerId) {
    return "scheduler (" + config_.scheduler_host + ":" + std::to_string(config_.scheduler_port) +
           ")";
  }
  if (id == transport::kNoNode) return "an unidentified node";
  return std::string(RoleName(layout_.RoleOf(id))) + " " + std::to_string(layout_.RankOf(id));
}

void Node::Start() {
  SetLogIdentity(RoleName(role_));
  transport_->SetHandlers([this](Message&& msg) { OnMessage(std::move(msg)); },
                          [this](NodeId peer, const std::string& remote, const std::string& why) {
                            OnPeerLost(peer, remote, why);
                          },
                          body_sink_);
  if (body_limit_) transport_->SetBodyLimit(body_limit_);
  self_.host = AnnounceAddress(config_);
  self_.port = ListenForJob(*transport_, config_, self_.host, config_.node_port);
  DTRAIN_LOG(kConnections) << RoleName(role_) << " listening at " << self_.Address()
                           << "; configuration: " << config_.Describe();

  const transport::Endpoint scheduler{config_.scheduler_host, config_.scheduler_port};
  try {
    transport_->Connect(transport::kSchedulerId, scheduler, transport::kNoNode,
                        Deadline(config_.connect_timeout));
  } catch (const TimeoutError& e) {
    throw TimeoutError("cannot reach the scheduler at " + scheduler.ToString() +
                       " (DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT): " + e.what() +
                       "; is it running? (DTRAIN_CONNECT_TIMEOUT_MS sets how long to try)");
  } catch (const PeerError& e) {
    throw PeerError("cannot join the job through the scheduler at " + scheduler.ToString() +
                    " (DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT): " + e.what());
  }
  control::Registration reg{role_, self_.host, self_.port, config_.requested_rank};
  Message msg;
  msg.header.command = Command::kRegister;
  msg.header.recipient = transport::kSchedulerId;
  msg.meta = control::EncodeRegistration(reg);
  transport_->Send(transport::kSchedulerId, std::move(msg));

  const Deadline start_deadline(config_.start_timeout);
  WaitUntil([this] { return have_table_; }, start_deadline,
            "the scheduler did not send the node table (the other nodes did not all register; "
            "DTRAIN_START_TIMEOUT_MS)");
  // Heartbeats from here on, while this node restores and connects to its peers too: a
  // replacement that waits for a peer cut off from it is alive, and the scheduler must not lose
  // it for its silence (issue 63's link cuts).
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_heard_from_scheduler_ = Clock::now();
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  SetLogIdentity(std::string(RoleName(role_)) + " " + std::to_string(self_.rank));
  report::SetIdentity(RoleName(role_), self_.rank, self_.host);
  report::Send({{"kind", "state"}, {"state", "running"}, {"address", self_.Address()}});
  DTRAIN_LOG(kConnections) << "joined as " << self_.Name() << " in a job of " << layout_.num_servers
                           << " server(s) and " << layout_.num_workers << " worker(s)";
  if (joined_) joined_();

  // Workers send requests to every server and servers answer every worker.
  std::vector<NodeInfo> peers;
  {
    std::lock_guard<std::mutex> lock(table_mutex_);
    peers = table_;
  }
  for (const NodeInfo& peer : peers) {
    const bool needed = (role_ == Role::kWorker && peer.role == Role::kServer) ||
                        (role_ == Role::kServer && peer.role == Role::kWorker);
    if (!needed) continue;
    try {
      ConnectToPeer(peer.id, Deadline(config_.connect_timeout));
    } catch (const TimeoutError& e) {
      std::string why = "cannot reach " + peer.Name() + ": " + e.what() +
                        " (is the address it announced reachable from here? see DMLC_INTERFACE / "
                        "DMLC_NODE_HOST)";
      Fail(why);
      throw PeerError(why);
    } catch (const PeerError& e) {
      std::string why = "cannot connect to " + peer.Name() + ": " + e.what();
      Fail(why);
      throw PeerError(why);
    }
  }
  SendControl(Command::kReady);
  WaitUntil([this] { return started_; }, start_deadline,
            "the scheduler did not start the job (not every node connected to its peers)");
}

void Node::SendControl(Command command, std::string meta) {
  Message msg;
  msg.header.command = command;
  msg.meta = std::move(meta);
  Send(transport::kSchedulerId, std::move(msg));
}

void Node::Send(NodeId to, Message msg) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) throw PeerError(*failure_);
  }
  msg.header.sender = self_.id;
  msg.header.recipient = to;
  transport_->Send(to, std::move(msg));
}

void Node::OnMessage(Message&& msg) {
  if (!IsControl(msg.header.command)) {
    if (data_handler_) data_handler_(std::move(msg));
    return;
  }
  OnControl(std::move(msg));
}

void Node::OnControl(Message&& msg) {
  const Command c = msg.header.command;
  std::unique_lock<std::mutex> lock(mutex_);
  if (msg.header.sender == transport::kSchedulerId) last_heard_from_scheduler_ = Clock::now();
  switch (c) {
    case Command::kNodeTable: {
      if (have_table_) return;
      auto nodes = control::DecodeNodeTable(msg.meta);
      const NodeId me = msg.header.recipient;
      // The table must match the layout from our own configuration, entry i being node i.
      if (static_cast<int>(nodes.size()) != layout_.NumNodes() || me < 1 ||
          me >= layout_.NumNodes()) {
        lock.unlock();
        Fail("the scheduler's node table has " + std::to_string(nodes.size()) +
             " nodes, but DMLC_NUM_SERVER + DMLC_NUM_WORKER + 1 = " +
             std::to_string(layout_.NumNodes()) + ": do all nodes have the same settings?");
        return;
      }
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i].id != static_cast<NodeId>(i)) throw ProtocolError("node table out of order");
      }
      {
        std::lock_guard<std::mutex> table_lock(table_mutex_);
        table_ = std::move(nodes);
        self_ = table_[me];
      }
      have_table_ = true;
      break;
    }
    case Command::kRejoin: {
      // Ahead of the node table, on the same stream: this process replaces a lost member. Its
      // barriers continue the job's count, so the first one it calls is the one the others are
      // at or will reach next.
      if (have_table_) return;
      const auto r = control::DecodeRejoin(msg.meta);
      barrier_done_[Group::kWorkers] = barrier_sent_[Group::kWorkers] = r.workers_barriers;
      barrier_done_[Group::kAll] = barrier_sent_[Group::kAll] = r.all_barriers;
      setup_barriers_before_joining_ = r.setup_barriers;
      rejoined_ = true;
      break;
    }
    case Command::kNodeReplaced:
      lock.unlock();
      return OnNodeReplaced(msg.meta);
    case Command::kReplacementStarted:
      lock.unlock();
      return OnReplacementStarted(msg.meta);
    case Command::kStart:
      started_ = true;
      break;
    case Command::kBarrierDone: {
      const auto b = control::DecodeBarrier(msg.meta);
      barrier_done_[b.group] = std::max(barrier_done_[b.group], b.sequence);
      break;
    }
    case Command::kHeartbeat:
      break;
    case Command::kTerminate:
      terminated_ = true;
      break;
    case Command::kNodeFailed: {
      auto f = control::DecodeFailure(msg.meta);
      lock.unlock();
      Fail(f.name + " failed: " + f.reason + " (reported by the scheduler)");
      return;
    }
    case Command::kFinish: {
      // The scheduler tells servers that a worker left before the others.
      lock.unlock();
      const NodeId id = static_cast<NodeId>(std::strtol(msg.meta.c_str(), nullptr, 10));
      if (worker_finished_ && layout_.IsWorker(id)) worker_finished_(layout_.RankOf(id));
      return;
    }
    case Command::kAbort:
      lock.unlock();
      Fail("the scheduler stopped the job: " + msg.meta);
      return;
    default:
      DTRAIN_LOG(kWarning) << "ignoring unexpected " << transport::CommandName(c) << " from "
                           << NameOf(msg.header.sender);
      return;
  }
  cv_.notify_all();
}

void Node::OnNodeReplaced(const std::string& meta) {
  auto nodes = control::DecodeNodeTable(meta);
  // Servers hear of workers' replacements; workers of servers', where servers can be replaced.
  const Role peer_role = role_ == Role::kServer ? Role::kWorker : Role::kServer;
  const bool allowed = role_ == Role::kServer || config_.ServersReplaceable();
  if (!allowed || nodes.size() != 1 || layout_.RoleOf(nodes[0].id) != peer_role ||
      nodes[0].role != peer_role || nodes[0].rank != layout_.RankOf(nodes[0].id)) {
    throw ProtocolError("a node-replaced message must name one peer, by its id and rank");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_down_ || failure_) return;
  replacement_connectors_.emplace_back([this, n = nodes[0]] { ConnectToReplacement(n); });
}

void Node::ConnectToPeer(NodeId id, const Deadline& deadline) {
  for (;;) {
    NodeInfo peer;
    {
      std::lock_guard<std::mutex> lock(table_mutex_);
      peer = table_[id];
    }
    try {
      transport_->Connect(id, {peer.host, peer.port}, self_.id,
                          Deadline(std::min(kTableRecheck, deadline.left())));
      return;
    } catch (const TimeoutError& e) {
      if (deadline.passed()) {
        throw TimeoutError("could not connect to " + peer.Address() + " within " +
                           std::to_string(Seconds(deadline.timeout())) + " s (" + e.what() + ")");
      }
    }
  }
}

void Node::ConnectToReplacement(NodeInfo replacement) {
  DTRAIN_LOG(kConnections) << "connecting to the replacement of " << replacement.Name();
  if (replacement.role == Role::kWorker && worker_replaced_) worker_replaced_(replacement.rank);
  if (replacement.role == Role::kServer && server_replaced_) server_replaced_(replacement.rank);
  transport_->ForgetPeer(replacement.id);
  {
    std::lock_guard<std::mutex> lock(table_mutex_);
    table_[replacement.id] = replacement;
  }
  try {
    transport_->Connect(replacement.id, {replacement.host, replacement.port}, self_.id,
                        Deadline(config_.connect_timeout));
    SendControl(Command::kReplacedReady, std::to_string(replacement.id));
  } catch (const Error& e) {
    // The scheduler's wait for the replacement ends the job if it cannot join.
    DTRAIN_LOG(kWarning) << "cannot connect to the replacement of " << replacement.Name() << ": "
                         << e.what();
  }
}

void Node::OnReplacementStarted(const std::string& meta) {
  const NodeId id = static_cast<NodeId>(std::strtol(meta.c_str(), nullptr, 10));
  if (role_ != Role::kWorker || !layout_.IsServer(id) || !config_.ServersReplaceable()) {
    throw ProtocolError("a replacement-started message must name a server, to a worker");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_down_ || failure_ || !server_restarted_) return;
  replacement_connectors_.emplace_back(
      [this, rank = layout_.RankOf(id)] { server_restarted_(rank); });
}

void Node::OnPeerLost(NodeId peer, const std::string& remote, const std::string& reason) {
  if (peer == transport::kNoNode) {
    // Every member's link says who it is in its Hello; one that did not is no member.
    DTRAIN_LOG(kWarning) << "a connection from " << remote
                         << " that never said which node it is closed: " << reason;
    return;
  }
  std::string name;
  bool replaceable = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (terminated_ || shut_down_) return;
    name = NameOf(peer);
    replaceable =
        (role_ == Role::kServer && layout_.IsWorker(peer) && config_.restart_wait.count() > 0) ||
        (role_ == Role::kWorker && layout_.IsServer(peer) && config_.ServersReplaceable());
    if (replaceable) {
      // The scheduler decides: it waits for a replacement, or fails the job when none comes.
      DTRAIN_LOG(kWarning) << name << " was lost (" << reason
                           << "); the job waits for its replacement (DTRAIN_RESTART_WAIT_MS)";
    } else if (started_ && peer != transport::kSchedulerId) {
      // At the end of a job a peer that got the scheduler's kTerminate exits and closes its link
      // to us, and our io threads may see that close before our own kTerminate (another
      // connection). So a lost worker or server counts only if the job has not ended by then; the
      // heartbeat thread decides. A death the scheduler sees reaches us at once as kNodeFailed.
      if (!pending_loss_) {
        pending_loss_ = name + " was lost: " + reason;
        pending_loss_deadline_ = Clock::now() + kPeerLossGrace;
      }
      cv_.notify_all();
      return;
    }
  }
  if (replaceable) {
    if (role_ == Role::kServer && worker_lost_) worker_lost_(layout_.RankOf(peer));
    return;
  }
  Fail(name + " was lost: " + reason);
}

void Node::Fail(const std::string& why) {
  std::vector<std::function<void(const std::string&)>> listeners;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_ || terminated_) return;
    failure_ = why;
    listeners = failure_listeners_;
  }
  cv_.notify_all();
  DTRAIN_LOG(kError) << why;
  report::Send({{"kind", "error"}, {"message", why}});
  for (auto& l : listeners) l(why);
  if (options_.exit_on_failure) {
    ExitNonZeroFromNowOn(why);
    const Duration grace = config_.failure_exit_grace;
    std::thread([grace, why] {
      std::this_thread::sleep_for(grace);
      report::Flush(std::chrono::milliseconds(500));
      LogLine(LogLevel::kError, "exiting: the job failed (" + why + ")");
      std::_Exit(1);
    }).detach();
  }
}

std::optional<std::string> Node::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void Node::ThrowIfFailed() const {
  if (auto f = failure()) throw PeerError(*f);
}

void Node::WaitUntil(const std::function<bool()>& pred, const Deadline& deadline,
                     const std::string& what) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_until(lock, deadline.at(), [&] { return pred() || failure_.has_value(); });
  if (failure_) throw PeerError(*failure_);
  if (!pred()) {
    throw TimeoutError(std::string(RoleName(role_)) + ": " + what + " within " +
                       std::to_string(Seconds(deadline.timeout())) + " s");
  }
}

uint64_t Node::setup_barriers_before_joining() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return setup_barriers_before_joining_;
}

void Node::Barrier(Group group, bool setup) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = ++barrier_sent_[group];
  }
  SendControl(Command::kBarrier, control::EncodeBarrier(group, seq, setup));
  WaitUntil([&] { return barrier_done_[group] >= seq; }, Deadline(config_.request_timeout),
            std::string("barrier of ") + GroupName(group) + " did not complete");
}

void Node::Finish() {
  SendControl(Command::kFinish);
  try {
    WaitUntil([this] { return terminated_; }, Deadline(config_.request_timeout),
              "the other workers did not finish");
  } catch (const TimeoutError& e) {
    // The job did not end in order: that is this node's failure too (and its exit code's).
    Fail(NameOf(transport::kSchedulerId) + " did not end the job: " + e.what());
    throw;
  }
}

int Node::WaitForTermination() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return terminated_ || failure_.has_value(); });
  return terminated_ ? 0 : 1;
}

void Node::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto next_heartbeat = Clock::now() + config_.heartbeat_interval;
  const auto ended = [this] { return shut_down_ || terminated_ || failure_.has_value(); };
  while (!ended()) {
    // cv_ is notified by every control message, the scheduler's answer to our heartbeat included:
    // only the end of the node or a lost peer may cut the interval short, or heartbeats would
    // ping-pong.
    auto wake = next_heartbeat;
    if (pending_loss_) wake = std::min(wake, pending_loss_deadline_);
    cv_.wait_until(lock, wake,
                   [&] { return ended() || (pending_loss_ && pending_loss_deadline_ < wake); });
    if (ended()) break;
    const auto now = Clock::now();
    if (pending_loss_ && now >= pending_loss_deadline_) {
      const std::string why = *pending_loss_;
      lock.unlock();
      Fail(why);
      return;
    }
    if (now < next_heartbeat) continue;
    next_heartbeat = now + config_.heartbeat_interval;
    const auto silent = now - last_heard_from_scheduler_;
    if (silent > config_.heartbeat_timeout) {
      lock.unlock();
      Fail(NameOf(transport::kSchedulerId) + " sent nothing for " +
           std::to_string(std::chrono::duration_cast<Duration>(silent).count()) +
           " ms (PS_HEARTBEAT_TIMEOUT)");
      return;
    }
    lock.unlock();
    try {
      SendControl(Command::kHeartbeat);
    } catch (const Error&) {
    }
    lock.lock();
  }
}

void Node::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  std::vector<std::thread> connectors;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    connectors.swap(replacement_connectors_);
  }
  for (auto& t : connectors) t.join();
  transport_->Shutdown(Deadline(Duration(5000)));
}

}  // namespace dtrain::ps

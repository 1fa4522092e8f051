#include "support/transport/inmemory_transport.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "common/buffer_pool.h"
#include "dtrain/common/error.h"
#include "common/logging.h"

namespace dtrain::transport {

// One network-wide mutex guards every node, link and queue below. A test network carries little
// traffic, and a single lock rules out lock-order deadlocks between a handler that sends, a Crash
// and a Shutdown running at once. Handlers, the filter, the body sink and body copies run unlocked.

// A one-way link: `from` sends, `to` receives.
namespace inmemory_internal {

struct Link {
  enum class State {
    kOpen,
    kClosing,  // the sender queued its Bye
    kClosed,   // the receiver took the Bye, or stopped while it was queued: not a loss
    kBroken,   // crash, cut, malformed message, or the receiver shut down: a loss
  };

  std::shared_ptr<Node> from;
  std::shared_ptr<Node> to;
  NodeId peer = kNoNode;    // whom `from` connected to
  NodeId self = kNoNode;    // `from`'s latest id as the sender knows it (the filter's `from`)
  NodeId sender = kNoNode;  // whom `to` attributes the link to
  State state = State::kOpen;
  std::string failure;           // why it broke
  Clock::time_point last_due{};  // keeps delayed messages in order
  int in_flight = 0;             // messages and Bye queued at `to`
  bool sender_told = false;      // a loss report for this link is queued at `from`
  bool receiver_told = false;    // ... at `to`
};

struct Item {
  enum class Kind { kMessage, kBye, kLostOutgoing, kLostIncoming };

  Kind kind = Kind::kMessage;
  std::shared_ptr<Link> link;
  Message msg;         // kMessage
  std::string reason;  // kLost*
};

struct Node {
  enum class Phase { kRunning, kShuttingDown, kStopped };
  struct Handlers {
    MessageHandler on_message;
    PeerLostHandler on_peer_lost;
    BodySink body_sink;
    BodyLimit body_limit;
  };

  std::string name;  // "inmem:PORT" once listening: the `remote` its peers are told
  uint16_t port = 0;
  bool listening = false;
  bool crashed = false;
  Phase phase = Phase::kRunning;
  std::shared_ptr<const Handlers> handlers;
  std::condition_variable wake;  // the delivery thread
  // Ordered by (due time, sequence number): FIFO per link because a link's due times never
  // decrease and sequence numbers grow.
  std::map<std::pair<Clock::time_point, uint64_t>, Item> queue;
  std::map<NodeId, std::shared_ptr<Link>> outgoing;
  std::vector<std::shared_ptr<Link>> incoming;
  std::set<NodeId> lost_reported;

  bool receiving() const { return !crashed && phase != Phase::kStopped; }
};

}  // namespace inmemory_internal

namespace {

using inmemory_internal::Item;
using inmemory_internal::Link;
using inmemory_internal::Node;
using LinkState = Link::State;
using ItemKind = Item::Kind;
using Phase = Node::Phase;

constexpr Duration kDestructorDrain{2000};

std::string SecondsText(Duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g s", Seconds(d));
  return text;
}

// Drops a node's queue; what it held will never be delivered.
void DiscardQueueLocked(Node& node) {
  for (auto& [key, item] : node.queue) {
    if (item.kind == ItemKind::kMessage || item.kind == ItemKind::kBye) --item.link->in_flight;
  }
  node.queue.clear();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// InMemoryNetwork

void InMemoryNetwork::SetFilter(FaultFilter filter) {
  auto shared = filter ? std::make_shared<const FaultFilter>(std::move(filter)) : nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  filter_ = std::move(shared);
}

void InMemoryNetwork::Crash(uint16_t port) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = listeners_.find(port);
  if (it == listeners_.end()) {
    throw InvalidArgument("cannot crash inmem:" + std::to_string(port) + ": nothing listens there");
  }
  std::shared_ptr<Node> node = it->second;
  listeners_.erase(it);
  node->crashed = true;
  DiscardQueueLocked(*node);
  const std::string reason = node->name + " crashed";
  for (auto& [peer, link] : node->outgoing) BreakLocked(link, reason, false, true);
  for (auto& link : node->incoming) BreakLocked(link, reason, true, false);
  DTRAIN_LOG(kConnections) << "inmem: " << reason;
  node->wake.notify_all();
  changed_.notify_all();
}

bool InMemoryNetwork::WaitForDelivered(uint64_t count, Deadline deadline) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_until(lock, deadline.at(), [&] { return delivered_.load() >= count; });
}

void InMemoryNetwork::BreakLocked(const std::shared_ptr<Link>& link, const std::string& reason,
                                  bool tell_sender, bool tell_receiver) {
  if (link->state == LinkState::kBroken || link->state == LinkState::kClosed) return;
  link->state = LinkState::kBroken;
  link->failure = reason;
  if (tell_sender && !link->sender_told && link->from->receiving()) {
    link->sender_told = true;
    EnqueueLocked(*link->from, Item{ItemKind::kLostOutgoing, link, {}, reason});
  }
  if (tell_receiver && !link->receiver_told && link->to->receiving()) {
    link->receiver_told = true;
    EnqueueLocked(*link->to, Item{ItemKind::kLostIncoming, link, {}, reason});
  }
  changed_.notify_all();
}

void InMemoryNetwork::EnqueueLocked(Node& node, Item item) {
  if (!node.receiving()) return;  // nobody will ever take it
  Clock::time_point due = Clock::now();
  if (item.kind == ItemKind::kMessage || item.kind == ItemKind::kBye) {
    // A message never overtakes one sent before it on the same link, delayed or not.
    due = std::max(due, item.link->last_due);
    item.link->last_due = due;
    ++item.link->in_flight;
  }
  node.queue.emplace(std::make_pair(due, next_seq_++), std::move(item));
  node.wake.notify_one();
}

// ---------------------------------------------------------------------------------------------
// InMemoryTransport

InMemoryTransport::InMemoryTransport(std::shared_ptr<InMemoryNetwork> network,
                                     InMemoryOptions options)
    : network_(std::move(network)), options_(options), node_(std::make_shared<Node>()) {
  if (!network_) throw InvalidArgument("InMemoryTransport needs a network");
  {
    std::lock_guard<std::mutex> lock(network_->mutex_);
    node_->name = "inmem:client-" + std::to_string(network_->next_serial_++);
  }
  thread_ = std::thread([this] { Run(); });
  thread_id_ = thread_.get_id();  // before Listen, so before any handler can call Shutdown
}

InMemoryTransport::~InMemoryTransport() {
  Shutdown(Deadline(kDestructorDrain));
  {
    std::lock_guard<std::mutex> guard(join_mutex_);
    if (thread_.joinable()) thread_.join();
  }
  // Handlers may hold objects that refer back to this transport: let them go now, unlocked, in
  // case their destructors use the network.
  std::shared_ptr<const Node::Handlers> handlers;
  {
    std::lock_guard<std::mutex> lock(network_->mutex_);
    handlers.swap(node_->handlers);
  }
}

void InMemoryTransport::SetHandlers(MessageHandler on_message, PeerLostHandler on_peer_lost,
                                    BodySink body_sink) {
  std::lock_guard<std::mutex> lock(network_->mutex_);
  BodyLimit limit = node_->handlers ? node_->handlers->body_limit : BodyLimit{};
  node_->handlers = std::make_shared<const Node::Handlers>(Node::Handlers{
      std::move(on_message), std::move(on_peer_lost), std::move(body_sink), std::move(limit)});
}

void InMemoryTransport::SetBodyLimit(BodyLimit limit) {
  std::lock_guard<std::mutex> lock(network_->mutex_);
  Node::Handlers handlers = node_->handlers ? *node_->handlers : Node::Handlers{};
  handlers.body_limit = std::move(limit);
  node_->handlers = std::make_shared<const Node::Handlers>(std::move(handlers));
}

uint16_t InMemoryTransport::Listen(const std::string& host, uint16_t port) {
  InMemoryNetwork& net = *network_;
  std::lock_guard<std::mutex> lock(net.mutex_);
  if (!node_->receiving() || node_->phase != Phase::kRunning) {
    throw Error("Listen on an in-memory transport that was shut down or crashed");
  }
  if (node_->listening) throw Error("Listen called twice (already at " + node_->name + ")");
  if (port == 0) {
    // Ports are handed out in turn rather than lowest-free-first, so that a port freed by a crash
    // is not reused at once by an unrelated node that a stale Connect would then reach.
    for (int tries = 0; tries < 65536 && port == 0; ++tries) {
      const uint16_t candidate = net.next_port_++;
      if (net.next_port_ == 0) net.next_port_ = 1;
      if (candidate != 0 && net.listeners_.count(candidate) == 0) port = candidate;
    }
    if (port == 0) throw Error("no free in-memory port");
  } else if (net.listeners_.count(port) != 0) {
    throw Error("cannot listen at " + host + ":" + std::to_string(port) +
                ": inmem:" + std::to_string(port) + " is already taken");
  }
  net.listeners_[port] = node_;
  node_->port = port;
  node_->listening = true;
  node_->name = "inmem:" + std::to_string(port);
  net.changed_.notify_all();  // Connect calls waiting for this port
  return port;
}

void InMemoryTransport::Connect(NodeId peer, const Endpoint& endpoint, NodeId self,
                                Deadline deadline) {
  InMemoryNetwork& net = *network_;
  std::unique_lock<std::mutex> lock(net.mutex_);
  std::shared_ptr<Node> target;
  while (true) {
    if (!node_->receiving() || node_->phase != Phase::kRunning) {
      throw Error("Connect on an in-memory transport that was shut down or crashed");
    }
    auto it = net.listeners_.find(endpoint.port);
    if (it != net.listeners_.end()) {
      target = it->second;
      break;
    }
    if (deadline.passed()) {
      throw TimeoutError("could not connect to node " + std::to_string(peer) + " at " +
                         endpoint.ToString() + ": nothing listened there within " +
                         SecondsText(deadline.timeout()));
    }
    net.changed_.wait_until(lock, deadline.at());
  }

  auto link = std::make_shared<Link>();
  link->from = node_;
  link->to = target;
  link->peer = peer;
  link->self = self;
  link->sender = self >= 0 ? self : kNoNode;  // what the Hello would say

  auto& slot = node_->outgoing[peer];
  if (slot && slot->state == LinkState::kOpen) {
    // Replaced: the old link ends in order, after what is queued on it.
    net.EnqueueLocked(*slot->to, Item{ItemKind::kBye, slot, {}, {}});
    slot->state = LinkState::kClosing;
  }
  slot = link;
  std::erase_if(target->incoming, [](const std::shared_ptr<Link>& l) {
    return l->state == LinkState::kClosed || l->state == LinkState::kBroken;
  });
  target->incoming.push_back(link);
  // A new link to a peer that was lost may be lost again, and that should be reported.
  node_->lost_reported.erase(peer);
  if (self >= 0) target->lost_reported.erase(self);
  DTRAIN_LOG(kConnections) << "inmem: " << node_->name << " (node " << self
                           << ") connected to node " << peer << " at " << target->name;
}

void InMemoryTransport::Send(NodeId peer, Message msg) {
  InMemoryNetwork& net = *network_;
  std::shared_ptr<Link> link;
  std::shared_ptr<const FaultFilter> filter;
  NodeId from = kNoNode;

  // Reports a send on a failed link as the loss of the peer (once), as a failed write would.
  auto report_failed_locked = [&] {
    if (link->state == LinkState::kBroken && !link->sender_told) {
      link->sender_told = true;
      net.EnqueueLocked(*node_, Item{ItemKind::kLostOutgoing,
                                     link,
                                     {},
                                     "cannot send to " + link->to->name + ": " + link->failure});
    }
  };

  {
    std::lock_guard<std::mutex> lock(net.mutex_);
    if (!node_->receiving() || node_->phase != Phase::kRunning) return;
    auto it = node_->outgoing.find(peer);
    if (it == node_->outgoing.end()) {
      throw PeerError("cannot send " + Describe(msg) + ": no link to node " + std::to_string(peer) +
                      " (Connect to it first)");
    }
    link = it->second;
    if (link->state != LinkState::kOpen) {
      report_failed_locked();
      return;
    }
    if (msg.header.sender >= 0) link->self = msg.header.sender;
    from = link->self;
    filter = net.filter_;
  }

  const FaultAction action = filter ? (*filter)(from, peer, msg) : FaultAction::Deliver();

  std::lock_guard<std::mutex> lock(net.mutex_);
  if (!node_->receiving() || node_->phase != Phase::kRunning) return;
  if (link->state != LinkState::kOpen) {
    report_failed_locked();
    return;
  }
  switch (action.kind) {
    case FaultAction::kDrop:
      ++net.dropped_;
      return;
    case FaultAction::kCut: {
      ++net.dropped_;
      const std::string reason =
          "link between " + node_->name + " and " + link->to->name + " cut by the network filter";
      Node* a = node_.get();
      Node* b = link->to.get();
      std::vector<std::shared_ptr<Link>> doomed;
      for (auto& [id, l] : a->outgoing) {
        if (l->to.get() == b) doomed.push_back(l);
      }
      for (auto& [id, l] : b->outgoing) {
        if (l->to.get() == a) doomed.push_back(l);
      }
      for (auto& l : doomed) net.BreakLocked(l, reason, true, true);
      return;
    }
    case FaultAction::kDelay:
    case FaultAction::kDeliver: {
      Item item{ItemKind::kMessage, link, std::move(msg), {}};
      if (action.kind == FaultAction::kDelay) {
        // EnqueueLocked keeps the later of this and the link's last due time.
        link->last_due = std::max(link->last_due, Clock::now() + action.delay);
      }
      net.EnqueueLocked(*link->to, std::move(item));
      return;
    }
  }
}

bool InMemoryTransport::IsConnected(NodeId peer) const {
  std::lock_guard<std::mutex> lock(network_->mutex_);
  if (!node_->receiving()) return false;
  auto it = node_->outgoing.find(peer);
  return it != node_->outgoing.end() && it->second->state == LinkState::kOpen;
}

uint16_t InMemoryTransport::port() const {
  std::lock_guard<std::mutex> lock(network_->mutex_);
  return node_->port;
}

void InMemoryTransport::Shutdown(Deadline deadline) {
  InMemoryNetwork& net = *network_;
  Node& node = *node_;
  const bool on_own_thread = std::this_thread::get_id() == thread_id_;
  {
    std::unique_lock<std::mutex> lock(net.mutex_);
    if (node.phase == Phase::kRunning) {
      node.phase = Phase::kShuttingDown;
      if (node.listening) {
        auto it = net.listeners_.find(node.port);
        if (it != net.listeners_.end() && it->second.get() == &node) net.listeners_.erase(it);
      }
      if (!node.crashed) {
        for (auto& [peer, link] : node.outgoing) {
          if (link->state != LinkState::kOpen) continue;
          net.EnqueueLocked(*link->to, Item{ItemKind::kBye, link, {}, {}});
          link->state = LinkState::kClosing;
        }
      }
      // Drained once every Bye is taken (it comes after everything else on its link). From one of
      // our own handlers, our own thread is busy: do not wait for links to ourselves.
      net.changed_.wait_until(lock, deadline.at(), [&] {
        for (auto& [peer, link] : node.outgoing) {
          if (link->state != LinkState::kClosing || link->in_flight == 0) continue;
          if (on_own_thread && link->to.get() == &node) continue;
          return false;
        }
        return true;
      });
      node.phase = Phase::kStopped;
      DiscardQueueLocked(node);
      for (auto& link : node.incoming) {
        // Whoever still sends to us will see us lost, as a write to a closed socket fails.
        if (link->state == LinkState::kOpen) {
          link->state = LinkState::kBroken;
          link->failure = node.name + " has shut down";
        }
        if (link->state == LinkState::kClosing) link->state = LinkState::kClosed;
      }
      node.wake.notify_all();
      net.changed_.notify_all();
    } else if (!on_own_thread) {
      // Another thread is shutting down: return once it is done.
      net.changed_.wait(lock, [&] { return node.phase == Phase::kStopped; });
    }
  }
  if (!on_own_thread) {
    std::lock_guard<std::mutex> guard(join_mutex_);
    if (thread_.joinable()) thread_.join();
  }
  // Links point at nodes and nodes at links: drop ours so that stopped nodes can be freed.
  std::lock_guard<std::mutex> lock(net.mutex_);
  node.outgoing.clear();
  node.incoming.clear();
}

// ---------------------------------------------------------------------------------------------
// The delivery thread

namespace {

// Copies `msg` as the receiver would read it off a socket. Returns the reason to break the link,
// or "" when the message may go to the handler (as `*out`).
std::string Receive(Message msg, const InMemoryOptions& options, const Node::Handlers* handlers,
                    Message* out) {
  Message decoded;
  const Body* source = &msg.body;
  if (options.validate_wire) {
    try {
      const std::string bytes = EncodeMessage(msg);
      decoded = DecodeMessage(bytes.data(), bytes.size(), options.limits);
    } catch (const ProtocolError& e) {
      return std::string("malformed message: ") + e.what();
    }
    out->header = decoded.header;
    out->meta = std::move(decoded.meta);
    source = &decoded.body;
  } else {
    out->header = msg.header;
    out->meta = std::move(msg.meta);
  }
  if (source->size == 0) return "";
  if (handlers != nullptr && handlers->body_limit) {
    const size_t limit = handlers->body_limit(out->header);
    if (source->size > limit) {
      out->header.flags |= kFlagBodyRefused;
      out->meta = BodyRefusal(source->size, limit);
      return "";
    }
  }

  Body target;
  if (handlers != nullptr && handlers->body_sink) {
    try {
      target = handlers->body_sink(out->header, source->size);
    } catch (const std::exception& e) {
      return std::string("the body sink failed: ") + e.what();
    }
    if (target.data != nullptr && target.size < source->size) {
      return "the body sink gave " + std::to_string(target.size) + " bytes for a body of " +
             std::to_string(source->size);
    }
  }
  if (target.data == nullptr) {
    auto buffer = BufferPool::Default().Get(source->size);
    target.data = buffer.get();
    target.owner = std::move(buffer);
  }
  std::memcpy(target.data, source->data, source->size);
  target.size = source->size;
  out->body = std::move(target);
  return "";
}

}  // namespace

void InMemoryTransport::Run() {
  InMemoryNetwork& net = *network_;
  Node& node = *node_;
  std::unique_lock<std::mutex> lock(net.mutex_);
  while (node.receiving()) {
    if (node.queue.empty()) {
      node.wake.wait(lock);
      continue;
    }
    auto first = node.queue.begin();
    if (first->first.first > Clock::now()) {
      node.wake.wait_until(lock, first->first.first);
      continue;
    }
    Item item = std::move(first->second);
    node.queue.erase(first);
    std::shared_ptr<const Node::Handlers> handlers = node.handlers;
    Link& link = *item.link;

    switch (item.kind) {
      case ItemKind::kBye:
        --link.in_flight;
        if (link.state == LinkState::kOpen || link.state == LinkState::kClosing) {
          link.state = LinkState::kClosed;
        }
        net.changed_.notify_all();
        break;

      case ItemKind::kMessage: {
        --link.in_flight;
        net.changed_.notify_all();
        if (link.state == LinkState::kBroken) break;  // it failed before this got through
        // Identity comes from the connection, as over TCP: the first id it used (Connect's
        // `self`, the Hello), never a later claim. A message under another id closes the link.
        const NodeId claimed = item.msg.header.sender;
        if (claimed >= 0 && link.sender == kNoNode) {
          link.sender = claimed;
        } else if (claimed >= 0 && claimed != link.sender) {
          const std::string forged = "it sent a message as node " + std::to_string(claimed) +
                                     " on the link of node " + std::to_string(link.sender);
          DTRAIN_LOG(kWarning) << "inmem: closing the link from " << link.from->name << " to "
                               << node.name << ": " << forged;
          net.BreakLocked(item.link, forged, true, true);
          break;
        }
        lock.unlock();
        Message msg;
        const std::string failure = Receive(std::move(item.msg), options_, handlers.get(), &msg);
        bool delivered = false;
        if (failure.empty() && handlers && handlers->on_message) {
          DTRAIN_LOG(kMessages) << "inmem: " << node.name << " got " << Describe(msg);
          try {
            handlers->on_message(std::move(msg));
          } catch (const std::exception& e) {
            DTRAIN_LOG(kError) << "inmem: message handler at " << node.name
                               << " threw: " << e.what();
          }
          delivered = true;
        }
        lock.lock();
        if (!failure.empty()) {
          DTRAIN_LOG(kWarning) << "inmem: closing the link from " << link.from->name << " to "
                               << node.name << ": " << failure;
          net.BreakLocked(item.link, failure, true, true);
        }
        if (delivered) {
          ++net.delivered_;
          net.changed_.notify_all();
        }
        break;
      }

      case ItemKind::kLostOutgoing:
      case ItemKind::kLostIncoming: {
        const bool outgoing = item.kind == ItemKind::kLostOutgoing;
        const NodeId peer = outgoing ? link.peer : link.sender;
        const std::string remote = outgoing ? link.to->name : link.from->name;
        if (peer != kNoNode && !node.lost_reported.insert(peer).second) break;  // told already
        DTRAIN_LOG(kConnections) << "inmem: " << node.name << " lost node " << peer << " at "
                                 << remote << ": " << item.reason;
        if (!handlers || !handlers->on_peer_lost) break;
        lock.unlock();
        try {
          handlers->on_peer_lost(peer, remote, item.reason);
        } catch (const std::exception& e) {
          DTRAIN_LOG(kError) << "inmem: peer-lost handler at " << node.name
                             << " threw: " << e.what();
        }
        lock.lock();
        break;
      }
    }
  }
}

}  // namespace dtrain::transport

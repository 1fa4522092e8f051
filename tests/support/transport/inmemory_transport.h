// InMemoryTransport: N nodes of a job in one process, for tests (tests/support: a test double,
// never linked into what users run).
//
// Every node gets its own InMemoryTransport; all of them attach to one shared InMemoryNetwork
// (create it with std::make_shared). The transports keep the contract of transport.h, as the TCP
// transport does, so protocol code cannot tell them apart:
//   - Listen registers the node at "inmem:PORT" (the host is ignored; port 0 picks a free one).
//   - Connect waits until something listens at the endpoint's port, up to its deadline.
//   - Delivery is asynchronous, on one delivery thread per receiving transport (never on the
//     sender's thread), first-in first-out per link. The body is copied on delivery, into the
//     receiver's BodySink if it gives memory, else into a pooled buffer, so that sender and
//     receiver never share memory. With validate_wire (the default) every message is encoded and
//     decoded again (wire.h), which exercises the codec and rejects what TCP would reject: a
//     malformed message breaks its link and both ends see the peer lost.
//   - The receiver attributes a link to the `self` given to Connect (the Hello over TCP), or, when
//     that was kNoNode, to the first message's header.sender >= 0; as over TCP, a later message
//     that claims another id breaks the link (both ends see the peer lost) and is not delivered.
//     Hello and Bye are internal: the message handler never sees them.
//   - on_peer_lost runs on the delivery thread, at most once per peer id (kNoNode: once per link)
//     until a new link with that peer is opened. When a link breaks, what is still queued on it
//     is lost, as unread bytes are when a connection resets.
//
// What TCP cannot do, the network can: crash a node (InMemoryNetwork::Crash) or drop, delay and
// cut messages (SetFilter), so that failure handling can be tested in one process.
//
// Threads: every method may be called from any thread, including from inside a handler (a server
// answering a request calls Send from on_message). Handlers run with no lock held. Shutdown and the
// destructor join the delivery thread; do not destroy a transport from one of its own handlers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/common/deadline.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace dtrain::transport {

// What the network does with one message; see InMemoryNetwork::SetFilter.
struct FaultAction {
  enum Kind {
    kDeliver,  // as usual
    kDrop,     // the message vanishes; nobody is told
    kDelay,    // delivered `delay` later; what follows on the same link waits behind it (FIFO)
    kCut,      // the message is lost and the links between the two nodes break: both see it
  };
  Kind kind = kDeliver;
  Duration delay{0};

  static FaultAction Deliver() { return {}; }
  static FaultAction Drop() { return {kDrop}; }
  static FaultAction Delay(Duration d) { return {kDelay, d}; }
  static FaultAction Cut() { return {kCut}; }
};

// `from` is the sender's id (the latest sender id it used on the link, else Connect's `self`), `to`
// the peer it connected to. Called on the sending thread, with no lock held, for every message
// passed to Send (not for the internal Hello and Bye).
using FaultFilter = std::function<FaultAction(NodeId from, NodeId to, const Message& msg)>;

struct InMemoryOptions {
  bool validate_wire = true;  // encode and decode every message (wire.h)
  Limits limits;              // what the decoding side accepts, as DTRAIN_MAX_MESSAGE_BYTES does
};

class InMemoryTransport;

namespace inmemory_internal {  // defined in inmemory_transport.cc
struct Node;
struct Link;
struct Item;
}  // namespace inmemory_internal

// The medium the transports of one test share. Thread-safe. Outlives its transports (they hold it).
class InMemoryNetwork {
 public:
  InMemoryNetwork() = default;
  InMemoryNetwork(const InMemoryNetwork&) = delete;
  InMemoryNetwork& operator=(const InMemoryNetwork&) = delete;

  // Replaces the filter; an empty one delivers everything.
  void SetFilter(FaultFilter filter);

  // The process listening at `port` dies: its transport stops receiving, delivering and sending,
  // and runs no handler again; every transport with a link to or from it gets on_peer_lost(peer,
  // "inmem:PORT", reason) once. The port becomes free. Throws InvalidArgument if nothing listens
  // at `port`.
  void Crash(uint16_t port);

  // Messages handed to an on_message handler that returned, over the whole network.
  uint64_t delivered() const { return delivered_.load(); }
  // Messages the filter dropped or cut.
  uint64_t dropped() const { return dropped_.load(); }
  // Waits until delivered() >= count; false at the deadline.
  bool WaitForDelivered(uint64_t count, Deadline deadline) const;

 private:
  friend class InMemoryTransport;
  using Node = inmemory_internal::Node;
  using Link = inmemory_internal::Link;
  using Item = inmemory_internal::Item;

  void BreakLocked(const std::shared_ptr<Link>& link, const std::string& reason, bool tell_sender,
                   bool tell_receiver);
  void EnqueueLocked(Node& node, Item item);

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;  // listeners, drains, delivered counts
  std::map<uint16_t, std::shared_ptr<Node>> listeners_;
  uint16_t next_port_ = 20000;
  uint64_t next_seq_ = 0;
  uint64_t next_serial_ = 0;
  std::shared_ptr<const FaultFilter> filter_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> dropped_{0};
};

class InMemoryTransport final : public Transport {
 public:
  explicit InMemoryTransport(std::shared_ptr<InMemoryNetwork> network,
                             InMemoryOptions options = {});
  ~InMemoryTransport() override;  // Shutdown with a short deadline
  InMemoryTransport(const InMemoryTransport&) = delete;
  InMemoryTransport& operator=(const InMemoryTransport&) = delete;

  void SetHandlers(MessageHandler on_message, PeerLostHandler on_peer_lost,
                   BodySink body_sink = {}) override;
  // Honoured as the TCP transport does: a longer body is not copied; the message is flagged.
  void SetBodyLimit(BodyLimit limit) override;
  // Throws Error if the port is taken, if called twice, or after Shutdown.
  uint16_t Listen(const std::string& host, uint16_t port) override;
  // Any host is accepted; only the port counts. Connecting again to the same peer replaces the
  // link (the old one is closed in order). Throws TimeoutError naming the endpoint at the deadline.
  void Connect(NodeId peer, const Endpoint& endpoint, NodeId self, Deadline deadline) override;
  // To a peer that crashed, was cut off or shut down: the message is dropped and on_peer_lost
  // reports it (once). Throws PeerError if Connect(peer) never succeeded. Ignored once this
  // transport is shutting down or crashed.
  void Send(NodeId peer, Message msg) override;
  bool IsConnected(NodeId peer) const override;
  // Says Bye on every outgoing link and waits, up to the deadline, until the peers have taken every
  // queued message (delayed ones included); then stops delivering. Links into this transport
  // become broken: a peer that sends to it afterwards sees it lost. Called from one of this
  // transport's handlers, it does not join the delivery thread (the destructor does).
  void Shutdown(Deadline deadline) override;

  // 0 before Listen.
  uint16_t port() const;
  // {"inmem", port()}: what peers pass to Connect.
  Endpoint endpoint() const { return {"inmem", port()}; }

 private:
  void Run();

  const std::shared_ptr<InMemoryNetwork> network_;
  const InMemoryOptions options_;
  std::shared_ptr<inmemory_internal::Node> node_;
  std::thread thread_;         // delivers messages and peer-lost reports
  std::thread::id thread_id_;  // thread_'s, readable while another thread joins it
  std::mutex join_mutex_;      // Shutdown may run on several threads at once
};

}  // namespace dtrain::transport

// Transport: moves messages between the nodes of one job.
//
// The parameter-server core talks only to this interface, so the same protocol code runs over TCP
// (tcp_transport.h) in production and over an in-memory network in tests
// (tests/support/transport/inmemory_transport.h), where messages can be dropped, delayed or cut.
// The same-host fast path (same_host.h) is no implementation of its own: it is an option inside
// TcpTransport (DTRAIN_SAME_HOST), chosen per stream in the handshake, and nothing above this
// interface sees it.
//
// Model: every node listens at one address. To send to a peer, a node first Connect()s to the
// peer's address; messages then flow one way over that link (the peer connects back to answer).
// Only the transport's own traffic comes back on it: over TCP, the handshake's answer and
// acknowledgements (tcp_transport.h).
// Messages on one link that share (key, part) arrive in the order they were sent; a link may use
// several streams (TCP connections) to carry different (key, part) pairs in parallel.
//
// Threads: handlers run on transport threads, possibly several at once (for messages from
// different streams); they must not block for long. Send/Connect/Shutdown may be called from any
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dtrain/common/deadline.h"
#include "transport/message.h"

namespace dtrain::transport {

struct Endpoint {
  std::string host;
  uint16_t port = 0;

  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// A message arrived. The receiving side attributes a stream to the sender id carried by the latest
// message on it (nodes learn their own id only after registering).
using MessageHandler = std::function<void(Message&& msg)>;

// A peer stopped being reachable: its stream closed without a Bye, a read or write failed, or a
// message from it was malformed (then the stream is closed). `peer` is kNoNode if the stream
// greeted us without saying who it was; `remote` is the address the stream came from; called at
// most once per peer. A stream that never completed the Hello is not reported (only logged).
using PeerLostHandler =
    std::function<void(NodeId peer, const std::string& remote, const std::string& reason)>;

// Optional: where to put the body of an arriving message, so that a pull response can be read
// straight into the caller's array. Return an empty Body (data == nullptr) for a pooled buffer.
// The returned Body must have size >= body_bytes.
using BodySink = std::function<Body(const Header& header, size_t body_bytes)>;

// Optional: the most bytes the body of a message with this header may have here (a server knows
// each key's size once it is initialised). A longer body is never allocated: the transport reads
// and drops it and delivers the message without it, with kFlagBodyRefused and the reason as meta.
using BodyLimit = std::function<size_t(const Header& header)>;

// The meta of a message whose body a BodyLimit refused.
inline std::string BodyRefusal(size_t bytes, size_t limit) {
  return "its body of " + std::to_string(bytes) + " bytes is more than the " +
         std::to_string(limit) + " expected here";
}

class Transport {
 public:
  virtual ~Transport() = default;

  // Must be called once, before Listen.
  virtual void SetHandlers(MessageHandler on_message, PeerLostHandler on_peer_lost,
                           BodySink body_sink = {}) = 0;

  // Optional, before Listen. Transports that allocate nothing for a peer on trust may ignore it.
  virtual void SetBodyLimit(BodyLimit limit) { (void)limit; }

  // Starts accepting links. host "" listens on all interfaces; port 0 picks a free port.
  // Returns the port bound. Throws Error if the address cannot be bound.
  virtual uint16_t Listen(const std::string& host, uint16_t port) = 0;

  // Opens the link used to send to `peer` at `endpoint`, announcing ourselves as `self`. Retries
  // while the peer is not yet listening. Throws TimeoutError (naming the endpoint) at the deadline.
  // A link opened before this node knows its id (self == kNoNode: the link to the scheduler) has a
  // single stream, so that the receiver can attribute all of it once our id is known.
  virtual void Connect(NodeId peer, const Endpoint& endpoint, NodeId self, Deadline deadline) = 0;

  // Queues `msg` to `peer` and returns without waiting for the bytes to leave. The body's owner is
  // kept until the message is written. A failure to deliver is reported through PeerLostHandler.
  // Throws PeerError if there is no link to `peer`.
  virtual void Send(NodeId peer, Message msg) = 0;

  // The process that was `peer` is gone and another (a replacement, with a new address) may take
  // its id: closes the link to it without reporting it, forgets that it was lost, and from now on
  // drops the loss reports of connections it made before (their resend windows end later).
  // Connect(peer, ...) then opens the link to the replacement.
  virtual void ForgetPeer(NodeId peer) { (void)peer; }

  // True if Connect(peer, ...) has succeeded and the link has not failed.
  virtual bool IsConnected(NodeId peer) const = 0;

  // Says Bye on every outgoing link, waits (up to the deadline) for queued messages to be written,
  // then closes everything and stops the transport's threads. Idempotent.
  virtual void Shutdown(Deadline deadline) = 0;
};

}  // namespace dtrain::transport

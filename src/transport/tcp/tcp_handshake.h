// The connecting side of a TCP stream's handshake, and the socket settings both sides share
// (internal to the transport; the exchange itself is drawn in tcp_transport.h, the accepting side
// is acceptor_greeting.h).
#pragma once

#include <asio.hpp>
#include <cstdint>
#include <string>

#include "auth/handshake.h"
#include "dtrain/common/deadline.h"
#include "dtrain/common/error.h"
#include "transport/message.h"
#include "transport/wire.h"

namespace dtrain::transport {

struct TcpOptions;

namespace tcp_handshake {

// Handshake frames carry a few words (nonces and proofs are 64 hex digits each).
constexpr size_t kMaxMeta = 1024;
// The labels of the transport's challenge-response (auth/handshake.h).
constexpr auth::HandshakeLabels kLabels{"dtrain-acceptor", "dtrain-connector"};

// A refusal by the other side, or a proof that does not check: retrying cannot help, so a
// connection attempt fails at once with this message instead of retrying until its deadline.
class Refused : public PeerError {
 public:
  using PeerError::PeerError;
};

// The peer's host name does not resolve (the resolver says no such name, or cannot answer now).
// Not a refusal: a
// cluster's DNS knows a pod's name only once the pod is Ready, which may be minutes after its
// peers start, so connecting retries it until its deadline.
class Unresolvable : public PeerError {
 public:
  using PeerError::PeerError;
};

// Nobody listens at the peer's address any more (the connection was refused). While a link is
// being re-established that means its process is gone, not that the network failed.
class NobodyListens : public PeerError {
 public:
  using PeerError::PeerError;
};

// Which logical stream a connection carries, for resending (PS_RESEND): its index among the
// link's streams, and whether it continues one that broke.
struct StreamIdentity {
  int index = 0;
  bool resume = false;
};

// What the accepting side answered.
struct Welcome {
  bool direct = false;     // the same-host fast path is on
  bool resend = false;     // it counts and acknowledges what it receives on this stream
  uint64_t delivered = 0;  // with resend: how many of the stream's messages it has received
};

// A kHello frame with this meta, ready to write.
std::string Frame(const std::string& meta);

// Keepalive and TCP_USER_TIMEOUT so that a silent peer is noticed within about `timeout`.
void SetLinkTimeout(asio::ip::tcp::socket& socket, Duration timeout);

std::string RemoteOf(const asio::ip::tcp::socket& socket);

// True if a connection between these two ends never leaves this host: the peer is a loopback
// address or our own (the kernel routes that over loopback too).
bool StaysOnThisHost(const asio::ip::tcp::endpoint& local, const asio::ip::tcp::endpoint& remote);

// Resolves and connects to host:port within the deadline, one attempt. Throws NobodyListens if
// the connection was refused or reached itself, Unresolvable if the name does not resolve,
// another Error otherwise.
asio::ip::tcp::socket Dial(asio::io_context& io, const std::string& host, uint16_t port,
                           const Deadline& deadline);

// Sends the hello on a fresh connection, authenticates both ways when there is a job secret, and
// reads the welcome. Throws Refused when retrying cannot help, another Error on failure or at the
// deadline.
Welcome Handshake(asio::ip::tcp::socket& socket, NodeId peer, NodeId self, StreamIdentity stream,
                  const Deadline& deadline, const TcpOptions& options, const Limits& limits);

}  // namespace tcp_handshake
}  // namespace dtrain::transport

// TcpTransport: the Transport over TCP, built on standalone Asio.
//
// Each link to a peer is `streams_per_peer` TCP connections; a message goes on the stream chosen by
// its (key, part), so messages of one slot stay in order while different slots of a big value
// travel in parallel (one TCP stream on loopback carries 2-3 GB/s, two carry twice that).
//
// Sending never copies the body: the header, meta and body are written with one gathered write,
// and Asio performs that write at once in the caller's thread when the stream is idle (its
// "speculative" write), so a small request costs no thread hand-off. Receiving reads through a
// 64 KiB staging buffer (small messages arrive in one read) and reads big bodies straight into
// their destination: the BodySink's buffer (a pull lands in the caller's array) or a pooled buffer.
//
// Messages flow one way on a stream: a node writes messages only on the streams it opened and reads
// them only on the ones it accepted. The socket itself carries both ways: the accepting side
// writes back the handshake answer and 8-byte acknowledgement words (the tokens of same-host
// bodies it has copied, same_host.h, and with PS_RESEND its count of messages delivered, below),
// and the connecting side reads them, which also tells it at once when the peer's end closes.
// kAck frames are different: they travel ahead of a message, on the acknowledging node's own
// stream (one it opened).
//
// The handshake, on every new stream (C connects, A accepts; each line one kHello frame whose meta
// is space-separated words):
//   without a job secret:  C: hello [same-host probe]         A: dtrain-welcome 1 direct=0|1
//   with one (job_auth.h): C: hello [probe] nonce=Nc           A: dtrain-challenge 1 nonce=Na
//   proof=Pa
//                          C: proof=Pc                         A: dtrain-welcome 1 direct=0|1
// Pa = HMAC(secret, acceptor; Nc, Na) proves A knows the secret; Pc = HMAC(secret, connector; Na,
// Nc, C's node id, C's hello) proves C does and binds what its hello claimed (its id, its pid for
// the same-host path). Either side that cannot check the other's proof answers
// `dtrain-welcome 1 refused=REASON` and closes; the connecting side then fails at once with a
// message saying which side lacks or differs in the secret. Until A has checked Pc, nothing the
// stream sends reaches the node, and its end is no member's failure (a stranger's, logged).
// After the handshake, the stream belongs to the node id its hello named (or, for the link to the
// scheduler opened before the node had an id, the first id it uses): a message claiming another
// sender closes the stream.
//
// PS_RESEND (on by default): the hello also says `stream=I` (the stream's index in its link) and
// the welcome `resend=1 delivered=N`. The acceptor counts the messages each (node, stream) has
// delivered and sends the count back: as a kAck frame ahead of its next message on its own stream
// to that node with the same index (replies travel on their request's index, so the count arrives
// just before the next request), and on the acknowledgement channel every 20 ms while messages
// arrive. The connector keeps each written message until it is counted. When a connection breaks
// without a Bye (reset, timeout, or closed: a reset can read as a clean close), the connector opens
// a new one with `resume=1` within the resend window, the acceptor answers the count it has
// delivered, and the connector resends the rest in order. The acceptor delivers nothing more from
// the broken connection once the new one has taken over, so every message is delivered exactly
// once, in order. The acceptor waits the same window for a broken stream to be resumed before it
// reports the peer lost; the connector gives up at once when nothing listens at the peer's address
// (its process ended), which is how a dead member is still reported within moments.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/config/config.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace dtrain::transport {

struct TcpOptions {
  int streams_per_peer = 2;
  int io_threads = 2;
  size_t max_message_bytes = size_t{1} << 32;
  // Same-host fast path (same_host.h, DTRAIN_SAME_HOST) for bodies of at least direct_min_bytes:
  // an option of this transport, used on each stream whose handshake finds both ends on one host.
  bool same_host_direct = true;
  size_t direct_min_bytes = 64 * 1024;
  // How long an accepted connection has to send its Hello before it is closed as a stranger's.
  Duration hello_timeout{10000};
  // Liveness of every connection (both directions): TCP keepalive probes while idle and
  // TCP_USER_TIMEOUT while data waits, so that a peer cut off by the network is reported within
  // about this long, not when a request times out. 0: the kernel's defaults.
  Duration link_timeout{15000};
  // Non-empty: every connection runs the challenge-response of auth/job_auth.h before any of its
  // messages counts, in both roles (connecting and accepting).
  std::string job_secret;
  // PS_RESEND: a stream that breaks between live members is re-established and what the peer had
  // not received is resent. Attempts back off from 50 ms up to resend_timeout apart, within
  // resend_window, after which the peer is reported lost.
  bool resend = true;
  Duration resend_timeout{1000};
  Duration resend_window{10000};
  // TCP_NOTSENT_LOWAT of the connections we write on: the kernel takes no more than about this
  // many bytes beyond what it is sending, so urgent messages overtake (OutStream). 0: no limit.
  size_t notsent_lowat = 256 * 1024;
  // The kernel's send buffer of the connections we write on to other hosts (sent and unsent bytes,
  // counted as net.ipv4.tcp_wmem counts them); Config::kAdaptiveSendBuffer sizes each from its
  // own measurements (send_buffer_tuner.h); 0 leaves it to the kernel's autotuning, as do
  // connections within this host.
  size_t send_buffer = Config::kAdaptiveSendBuffer;
  // The congestion control of the connections we write on within this host (empty: the kernel's
  // default). On loopback there is no loss or queue to control; BBR's pacing only slowed it.
  std::string local_congestion = "cubic";

  // The settings in effect from DTRAIN_STREAMS_PER_PEER, DTRAIN_IO_THREADS,
  // DTRAIN_MAX_MESSAGE_BYTES, DTRAIN_SAME_HOST, DTRAIN_HELLO_TIMEOUT_MS, DTRAIN_LINK_TIMEOUT_MS,
  // DTRAIN_JOB_SECRET, PS_RESEND, PS_RESEND_TIMEOUT, DTRAIN_RESEND_WINDOW_MS,
  // DTRAIN_TCP_NOTSENT_LOWAT, DTRAIN_TCP_SNDBUF and DTRAIN_TCP_LOCAL_CONGESTION.
  static TcpOptions FromConfig(const Config& config);
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(TcpOptions options = {});
  ~TcpTransport() override;

  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  void SetHandlers(MessageHandler on_message, PeerLostHandler on_peer_lost,
                   BodySink body_sink = {}) override;
  void SetBodyLimit(BodyLimit limit) override;
  uint16_t Listen(const std::string& host, uint16_t port) override;
  void Connect(NodeId peer, const Endpoint& endpoint, NodeId self, Deadline deadline) override;
  void Send(NodeId peer, Message msg) override;
  void ForgetPeer(NodeId peer) override;
  bool IsConnected(NodeId peer) const override;
  void Shutdown(Deadline deadline) override;

  // Defined in tcp_transport_impl.h, which only the transport's own files include.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::transport

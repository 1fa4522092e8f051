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
// them only on the ones it accepted. The accepting side writes back only the handshake answer and,
// on the same-host fast path (same_host.h), acknowledgements of bodies it has copied.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace dtrain::transport {

struct TcpOptions {
  int streams_per_peer = 2;
  int io_threads = 2;
  size_t max_message_bytes = size_t{1} << 32;
  // Same-host fast path (same_host.h) for bodies of at least direct_min_bytes.
  bool same_host_direct = true;
  size_t direct_min_bytes = 64 * 1024;
  // How long an accepted connection has to send its Hello before it is closed as a stranger's.
  Duration hello_timeout{10000};

  // The settings in effect from DTRAIN_STREAMS_PER_PEER, DTRAIN_IO_THREADS,
  // DTRAIN_MAX_MESSAGE_BYTES, DTRAIN_SAME_HOST and DTRAIN_HELLO_TIMEOUT_MS.
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
  uint16_t Listen(const std::string& host, uint16_t port) override;
  void Connect(NodeId peer, const Endpoint& endpoint, NodeId self, Deadline deadline) override;
  void Send(NodeId peer, Message msg) override;
  bool IsConnected(NodeId peer) const override;
  void Shutdown(Deadline deadline) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::transport

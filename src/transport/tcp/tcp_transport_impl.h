// TcpTransport's insides: what the transport keeps (links, incoming connections, the io threads),
// shared by tcp_transport.cc (listening, connecting, the public calls), the streams it reads
// (in_stream.h) and the streams it writes (out_stream.h).
#pragma once

#include <asio.hpp>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "transport/tcp/inbound_count.h"
#include "transport/tcp/send_buffer_tuner.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/tcp/tcp_transport.h"

namespace dtrain::transport {

// On the acknowledgement channel (acceptor to connector), an 8-byte word with this bit set carries
// the count of the stream's messages received (PS_RESEND); one without it is the token of a
// same-host body that has been copied.
constexpr uint64_t kDeliveredBit = uint64_t{1} << 63;

struct TcpTransport::Impl {
  struct OutStream;  // out_stream.h
  struct InStream;   // in_stream.h

  explicit Impl(TcpOptions opts) : options(opts) { limits.max_body_bytes = opts.max_message_bytes; }

  TcpOptions options;
  Limits limits;
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  asio::ip::tcp::acceptor acceptor{io};
  MessageHandler on_message;
  PeerLostHandler on_peer_lost;
  BodySink body_sink;
  BodyLimit body_limit;

  mutable std::mutex mutex;  // guards the members below
  std::map<NodeId, std::vector<std::shared_ptr<OutStream>>> links;
  std::set<std::shared_ptr<InStream>> incoming;
  // PS_RESEND: what each peer's streams to us have delivered, by (peer, stream index), kept across
  // the connections that carry them.
  std::map<std::pair<NodeId, int>, std::shared_ptr<Inbound>> inbound;
  std::vector<std::thread> reconnectors;  // threads re-establishing broken streams
  std::condition_variable stopping;       // wakes reconnectors' pauses at shutdown
  std::set<NodeId> lost;
  std::set<NodeId> departed;  // said Bye: their closing is not a failure
  // How often each peer's id was handed to a new process (ForgetPeer); a connection remembers the
  // count when it learns its peer, and its loss is reported only while the count is unchanged.
  std::map<NodeId, uint64_t> incarnation;
  NodeId self = kNoNode;
  bool stopped = false;
  std::atomic<bool> shutting_down{false};

  void StartThreads();
  void Accept();
  void ReportLost(NodeId peer, const std::string& remote, const std::string& reason);
  // The same, from a connection that learnt its peer while `seen` was the peer's incarnation.
  void ReportLost(NodeId peer, uint64_t seen, const std::string& remote, const std::string& reason);
  uint64_t IncarnationOf(NodeId peer) const {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = incarnation.find(peer);
    return it == incarnation.end() ? 0 : it->second;
  }
  void DropStranger(const std::string& remote, const std::string& reason);
  std::atomic<uint64_t> strangers_dropped{0};
  void MarkDeparted(NodeId peer) {
    std::lock_guard<std::mutex> lock(mutex);
    departed.insert(peer);
  }
  bool Departed(NodeId peer) const {
    std::lock_guard<std::mutex> lock(mutex);
    return departed.count(peer) != 0;
  }
  void Forget(const std::shared_ptr<InStream>& stream) {
    std::lock_guard<std::mutex> lock(mutex);
    incoming.erase(stream);
  }
  // Opens and greets one stream to `peer` (one attempt, within the deadline), with the socket
  // options every connection gets. Throws as tcp_handshake::Dial and Handshake do.
  std::pair<asio::ip::tcp::socket, tcp_handshake::Welcome> Open(
      NodeId peer, const Endpoint& endpoint, NodeId self, tcp_handshake::StreamIdentity stream,
      const Deadline& deadline);
  // The tuner of a socket we write on (DTRAIN_TCP_SNDBUF=auto) where it reaches another host;
  // null otherwise.
  std::unique_ptr<SendBufferTuner> SendBufferTunerFor(asio::ip::tcp::socket& socket) const;
};

}  // namespace dtrain::transport

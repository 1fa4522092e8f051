// One stream TcpTransport writes messages on, to one peer (see tcp_transport_impl.h for the
// transport that holds it and in_stream.h for the connections it reads).
#pragma once

#include <array>
#include <asio.hpp>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "transport/tcp/send_buffer_tuner.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/tcp/tcp_transport_impl.h"

namespace dtrain::transport {

// One stream we write messages on (and read the peer's acknowledgement words from, which also
// shows at once that its end closed). Messages wait here, the highest priority first; one is
// written at once in the caller's thread (Asio's speculative write) and later ones by the io thread
// that completes the previous. The socket's TCP_NOTSENT_LOWAT keeps the kernel from taking much
// more than it can send soon, so that an urgent message overtakes the ones waiting instead of
// queueing behind megabytes in the kernel's buffer.
//
// With PS_RESEND (negotiated in the handshake), a written message stays queued until the peer
// acknowledges having received it, and each message has a sequence number. When the connection
// breaks while both ends live, a reconnector thread opens a new one, within the resend window,
// greeting the peer as the same stream; the peer answers how many messages it has received, and
// the rest are written again, in order. A peer that refuses the new connection (nothing listens
// any more: its process ended) or stays unreachable for the window is lost.
struct TcpTransport::Impl::OutStream : std::enable_shared_from_this<OutStream> {
  OutStream(Impl* impl, NodeId peer, Endpoint endpoint, int index, asio::ip::tcp::socket socket,
            const tcp_handshake::Welcome& welcome);

  struct Item {
    uint64_t seq = 0;
    bool ack_first = false;  // a kAck frame goes just before this message
    WireHeader ack;
    WireHeader header;
    Message msg;
    bool remote_body = false;
    std::array<uint64_t, 2> descriptor{};  // address, token
  };

  Impl* const impl;
  const NodeId peer;
  const uint64_t incarnation;  // the peer's when this stream was opened (Impl::incarnation)
  const Endpoint endpoint;
  const int index;  // among the link's streams
  std::shared_ptr<asio::ip::tcp::socket> socket;
  std::string remote;
  std::mutex mutex;                        // guards the members below
  std::unique_ptr<SendBufferTuner> tuner;  // of `socket`
  std::condition_variable drained;
  // Messages whose writing has started, in the order of their sequence numbers; the first `written`
  // are written, waiting for the peer's count (PS_RESEND).
  std::deque<Item> queue;
  size_t written = 0;
  // Messages not yet started, the highest priority first, equal ones in the order they came.
  std::multimap<int, Item, std::greater<int>> waiting;
  bool writing = false;
  bool old_closed = true;  // the broken connection is closed: its write no longer reads the queue
  enum class State { kLive, kReconnecting, kFailed } state = State::kLive;
  uint64_t generation = 0;  // of the connection: handlers of an abandoned one are ignored
  bool resend = false;
  uint64_t next_seq = 0;
  uint64_t acked = 0;  // the peer has received every message before this one
  // What we have received on the stream that comes back from the peer with our index (its replies
  // to what we send here), set by that InStream; written to the peer ahead of our next message,
  // so that the peer releases what it holds for resending before it handles that message.
  std::atomic<uint64_t> reverse_delivered{0};
  uint64_t reverse_sent = 0;
  // Same-host fast path: bodies the peer has not yet acknowledged copying, by token.
  bool direct = false;
  uint64_t next_token = 1;
  std::unordered_map<uint64_t, Body> awaiting_ack;
  std::array<char, 4096> ack_buffer{};
  size_t ack_have = 0;

  void Enqueue(Message&& msg);
  // The peer has received our first `count` messages (PS_RESEND).
  void Acknowledge(uint64_t count);
  void ReadAcks();
  bool WaitDrained(const Deadline& deadline);
  // Closes the connection; at shutdown, or once the peer is lost.
  void Close();

 private:
  void Encode(Item& item);                    // mutex held
  void StartWrite();                          // mutex held; something is left to write
  bool Drained() const;                       // mutex held: everything written and acknowledged
  int PlaceInLine(const Message& msg) const;  // mutex held
  void OnWritten(uint64_t gen, const std::error_code& ec, size_t bytes);
  void ReadAcksOn(std::shared_ptr<asio::ip::tcp::socket> on, uint64_t gen);  // mutex held
  void OnAcks(const std::shared_ptr<asio::ip::tcp::socket>& on, uint64_t gen,
              const std::error_code& ec, size_t n);
  void DropAcknowledged();            // mutex held
  void AdvanceAcked(uint64_t count);  // mutex held: the peer has our first `count` messages
  // The connection of generation `gen` failed: resend over a new one, or report the peer lost.
  // Even a clean close may be the network's doing (a reset can read as one once a write has taken
  // the error), so it is retried too; a peer whose process ended refuses the new connection.
  void OnBroken(uint64_t gen, const std::string& reason);
  void Reconnect(std::string reason);
  bool Resume(asio::ip::tcp::socket fresh, const tcp_handshake::Welcome& welcome, std::string* why);
  void GiveUp(const std::string& reason);
};

}  // namespace dtrain::transport

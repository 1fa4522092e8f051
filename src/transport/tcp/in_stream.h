// One connection TcpTransport accepted and reads from. Its work is in three files, one per
// concern, all on the connection's strand:
//   in_stream.cc            framing: header, meta, body (refused bodies skipped, same-host bodies
//                           copied), handing the message over, failures;
//   in_stream_handshake.cc  the accepting side's handshake (acceptor_greeting.h) and its deadline;
//   in_stream_resend.cc     PS_RESEND: counting what the stream delivered, acknowledging it, and
//                           waiting for a broken stream to resume on a new connection.
// Besides messages it writes back the handshake's answers and acknowledgement words; the
// messages this node sends to the peer go on an OutStream (out_stream.h).
#pragma once

#include <array>
#include <asio.hpp>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/tcp/acceptor_greeting.h"
#include "transport/tcp/inbound_count.h"
#include "transport/tcp/same_host.h"
#include "transport/tcp/tcp_transport_impl.h"
#include "transport/wire.h"

namespace dtrain::transport {

struct TcpTransport::Impl::InStream : std::enable_shared_from_this<InStream> {
  InStream(Impl* impl, asio::ip::tcp::socket socket);

  Impl* const impl;
  asio::ip::tcp::socket socket;
  const std::string remote;
  std::atomic<NodeId> peer{kNoNode};     // from the hello; never from a later claim
  std::atomic<uint64_t> incarnation{0};  // the peer's when we learnt it (Impl::incarnation)

  // Reads and hands over messages until the connection ends; once, after the accept.
  void Pump();
  // Closes the connection if it is not greeted within DTRAIN_HELLO_TIMEOUT_MS.
  void StartHelloDeadline();
  // At shutdown, on the strand: ends every wait, the resend window's included.
  void Abort();

 private:
  // --- framing (in_stream.cc)
  size_t buffered() const { return end - begin; }
  size_t TakeStaged(char* dst, size_t n);  // consumes up to n staged bytes; returns how many
  size_t Skip(size_t n);
  void ReadMore();
  void ReadMeta(size_t got);
  bool StartBody();  // true if the message is complete (and dispatched) without a read
  bool BodyTooLong(size_t n);
  void DiscardMore();
  Body Destination(size_t n);
  bool StartRemoteBody();
  bool CopyRemoteBody();
  void Dispatch();
  // Writes back on this connection (handshake answers, acknowledgements).
  void Write(std::string bytes);
  void Fail(const std::error_code& ec);
  void Fail(const std::string& reason);
  void Lose(const std::string& reason, bool may_resume);
  void Close();

  std::vector<char> staging;
  size_t begin = 0;
  size_t end = 0;
  Frame frame;
  Message pending;
  size_t discard_left = 0;               // bytes of a refused body still to read and drop
  std::array<uint64_t, 2> descriptor{};  // a same-host body's address and token
  std::string out_pending;               // answers and acknowledgements not yet written
  std::string out_flight;
  bool said_bye = false;

  // --- the handshake (in_stream_handshake.cc)
  void OnHandshake(Message&& msg);
  void Refuse(const std::string& frame, const std::string& reason);
  void Greet(const Message& first);
  same_host::ConnectionEnds Ends() const;

  // On the strand: the hello's deadline, and once the connection broke, the resend window's.
  asio::steady_timer hello_timer;
  tcp_handshake::AcceptorGreeting greeting;
  bool greeted = false;  // the handshake is complete: messages count from now on
  bool refused = false;  // a refusal is being written; the connection closes after it
  int sender_pid = 0;    // non-zero: the same-host fast path is on for this connection

  // --- PS_RESEND (in_stream_resend.cc), when the connector asked for it
  uint64_t Carry(NodeId sender, bool resume);
  std::shared_ptr<OutStream> Reverse();
  bool Carries();
  bool Count(size_t body_bytes);
  void WriteDelivered(uint64_t delivered);
  void OnAckTimer(const std::error_code& ec);
  void AwaitResume(const std::string& reason);

  int stream_index = -1;             // which of its link's streams this connection carries
  std::shared_ptr<Inbound> inbound;  // that stream's count, shared with its earlier connections
  std::weak_ptr<OutStream> reverse;  // our stream back to the peer with the same index
  asio::steady_timer ack_timer;
  AckSchedule acks;
};

}  // namespace dtrain::transport

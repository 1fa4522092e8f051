#include "transport/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <asio.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <optional>
#include <unordered_map>

#include "common/buffer_pool.h"
#include "common/error.h"
#include "common/job_auth.h"
#include "common/logging.h"
#include "transport/same_host.h"

namespace dtrain::transport {

using asio::ip::tcp;

namespace {

constexpr size_t kStagingBytes = 64 * 1024;
// Handshake frames carry a few words (nonces and proofs are 64 hex digits each).
constexpr size_t kMaxHandshakeMeta = 1024;
constexpr char kAcceptorLabel[] = "dtrain-acceptor";
constexpr char kConnectorLabel[] = "dtrain-connector";

// A refusal by the other side, or a proof that does not check: retrying cannot help, so Connect
// fails at once with this message instead of retrying until its deadline.
class HandshakeRefused : public PeerError {
 public:
  using PeerError::PeerError;
};

std::string HandshakeFrame(const std::string& meta) {
  Header h;
  h.command = Command::kHello;
  WireHeader wire = EncodeHeader(h, meta.size(), 0);
  return std::string(wire.begin(), wire.end()) + meta;
}

// Keepalive: first probe after a third of the timeout idle, then 4 probes spread over the rest;
// TCP_USER_TIMEOUT bounds how long sent data (or a probe) may stay unacknowledged. Best effort: a
// failing setsockopt leaves the kernel's defaults.
void SetLinkTimeout(tcp::socket& socket, Duration timeout) {
  if (timeout.count() <= 0) return;
  const int fd = socket.native_handle();
  const int on = 1;
  const int idle_s = std::max<int>(1, static_cast<int>(timeout.count() / 3000));
  const int interval_s = std::max<int>(1, static_cast<int>(timeout.count() / 6000));
  const int probes = 4;
  const unsigned user_timeout_ms = static_cast<unsigned>(timeout.count());
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

bool IsNonce(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string RemoteOf(const tcp::socket& socket) {
  std::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  if (ec) return "(unknown)";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

}  // namespace

TcpOptions TcpOptions::FromConfig(const Config& config) {
  TcpOptions options;
  options.streams_per_peer = config.streams_per_peer;
  options.io_threads = config.io_threads;
  options.max_message_bytes = config.max_message_bytes;
  options.same_host_direct = config.same_host_direct;
  options.hello_timeout = config.hello_timeout;
  options.link_timeout = config.link_timeout;
  options.job_secret = config.job_secret;
  return options;
}

struct TcpTransport::Impl {
  struct OutStream;
  struct InStream;

  explicit Impl(TcpOptions opts) : options(opts) { limits.max_body_bytes = opts.max_message_bytes; }

  TcpOptions options;
  Limits limits;
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  tcp::acceptor acceptor{io};
  MessageHandler on_message;
  PeerLostHandler on_peer_lost;
  BodySink body_sink;
  BodyLimit body_limit;

  mutable std::mutex mutex;  // guards the members below
  std::map<NodeId, std::vector<std::shared_ptr<OutStream>>> links;
  std::set<std::shared_ptr<InStream>> incoming;
  std::set<NodeId> lost;
  std::set<NodeId> departed;  // said Bye: their closing is not a failure
  NodeId self = kNoNode;
  bool stopped = false;
  std::atomic<bool> shutting_down{false};

  void StartThreads();
  void Accept();
  void ReportLost(NodeId peer, const std::string& remote, const std::string& reason);
  void DropStranger(const std::string& remote, const std::string& reason);
  std::atomic<uint64_t> strangers_dropped{0};
  void MarkDeparted(NodeId peer) {
    std::lock_guard<std::mutex> lock(mutex);
    departed.insert(peer);
  }
  void Forget(const std::shared_ptr<InStream>& stream) {
    std::lock_guard<std::mutex> lock(mutex);
    incoming.erase(stream);
  }
};

// One connection we write on. Messages queue here; the first one is written at once in the caller's
// thread (Asio's speculative write) and later ones by the io thread that completes the previous.
struct TcpTransport::Impl::OutStream : std::enable_shared_from_this<OutStream> {
  OutStream(Impl* impl, NodeId peer, tcp::socket socket, bool direct)
      : impl(impl),
        peer(peer),
        socket(std::move(socket)),
        remote(RemoteOf(this->socket)),
        direct(direct) {}

  struct Item {
    WireHeader header;
    Message msg;
    bool remote_body = false;
    std::array<uint64_t, 2> descriptor{};  // address, token
  };

  Impl* const impl;
  const NodeId peer;
  tcp::socket socket;
  const std::string remote;
  std::mutex mutex;
  std::condition_variable drained;
  std::deque<Item> queue;
  bool writing = false;
  bool failed = false;
  // Same-host fast path: bodies the peer has not yet acknowledged copying, by token.
  const bool direct;
  uint64_t next_token = 1;
  std::unordered_map<uint64_t, Body> awaiting_ack;
  std::array<char, 4096> ack_buffer{};
  size_t ack_have = 0;

  void Enqueue(Message&& msg) {
    std::unique_lock<std::mutex> lock(mutex);
    if (failed) {
      lock.unlock();
      impl->ReportLost(peer, remote, "the connection to it failed earlier");
      return;
    }
    Item item;
    if (direct && msg.body.size >= impl->options.direct_min_bytes) {
      msg.header.flags |= kFlagRemoteBody;
      item.remote_body = true;
      item.descriptor = {reinterpret_cast<uint64_t>(msg.body.data), next_token++};
      // Registered before the descriptor can leave: the acknowledgement may come back before the
      // write's completion handler runs.
      awaiting_ack[item.descriptor[1]] = msg.body;
    }
    item.header = EncodeHeader(msg.header, msg.meta.size(), msg.body.size);
    item.msg = std::move(msg);
    queue.push_back(std::move(item));
    if (!writing) StartWrite();
  }

  // Reads the peer's acknowledgements of remote bodies (8-byte tokens), and on every stream notices
  // at once when the peer's end closes or resets (a stream we only wrote on would learn it at our
  // next write, which may be long: the scheduler writes to a node rarely). Runs on the socket's
  // strand; the reactor serialises it with writes initiated from other threads per descriptor.
  void ReadAcks() {
    socket.async_read_some(asio::buffer(ack_buffer.data() + ack_have, ack_buffer.size() - ack_have),
                           [self = shared_from_this()](const std::error_code& ec, size_t n) {
                             if (ec) return self->OnAckError(ec);
                             self->ack_have += n;
                             size_t whole = self->ack_have / 8 * 8;
                             {
                               std::lock_guard<std::mutex> lock(self->mutex);
                               for (size_t i = 0; i < whole; i += 8) {
                                 uint64_t token;
                                 std::memcpy(&token, self->ack_buffer.data() + i, 8);
                                 self->awaiting_ack.erase(token);
                               }
                               if (self->queue.empty() && self->awaiting_ack.empty())
                                 self->drained.notify_all();
                             }
                             std::memmove(self->ack_buffer.data(), self->ack_buffer.data() + whole,
                                          self->ack_have - whole);
                             self->ack_have -= whole;
                             self->ReadAcks();
                           });
  }

  void OnAckError(const std::error_code& ec) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      failed = true;
      awaiting_ack.clear();
      drained.notify_all();
    }
    if (ec == asio::error::operation_aborted) return;
    impl->ReportLost(peer, remote,
                     ec == asio::error::eof
                         ? std::string("its connection closed (the process exited or died)")
                         : "reading from it failed: " + ec.message());
  }

  // Mutex held. Deque elements stay put while others are pushed, so the buffers remain valid.
  void StartWrite() {
    writing = true;
    Item& item = queue.front();
    std::array<asio::const_buffer, 3> buffers{
        asio::buffer(item.header), asio::buffer(item.msg.meta),
        item.remote_body
            ? asio::buffer(item.descriptor)
            : asio::buffer(static_cast<const void*>(item.msg.body.data), item.msg.body.size)};
    asio::async_write(
        socket, buffers,
        [self = shared_from_this()](const std::error_code& ec, size_t) { self->OnWritten(ec); });
  }

  void OnWritten(const std::error_code& ec) {
    std::unique_lock<std::mutex> lock(mutex);
    if (ec) {
      failed = true;
      writing = false;
      queue.clear();
      awaiting_ack.clear();
      drained.notify_all();
      lock.unlock();
      impl->ReportLost(peer, remote, "sending to it failed: " + ec.message());
      return;
    }
    queue.pop_front();
    if (queue.empty()) {
      writing = false;
      drained.notify_all();
    } else {
      StartWrite();
    }
  }

  bool WaitDrained(const Deadline& deadline) {
    std::unique_lock<std::mutex> lock(mutex);
    return drained.wait_until(lock, deadline.at(),
                              [this] { return queue.empty() && awaiting_ack.empty(); });
  }
};

// One connection we read from: header, meta, body, hand the message over, repeat.
struct TcpTransport::Impl::InStream : std::enable_shared_from_this<InStream> {
  InStream(Impl* impl, tcp::socket socket)
      : impl(impl),
        socket(std::move(socket)),
        remote(RemoteOf(this->socket)),
        hello_timer(this->socket.get_executor()) {
    staging.resize(kStagingBytes);
  }

  Impl* const impl;
  tcp::socket socket;
  const std::string remote;
  asio::steady_timer hello_timer;  // on the socket's strand, as every handler of the stream
  std::atomic<NodeId> peer{kNoNode};
  bool said_bye = false;
  bool greeted = false;  // the handshake is complete: messages count from now on
  bool refused = false;  // a refusal is being written; the stream closes after it
  // With a job secret, between the hello and the connector's proof:
  std::optional<Message> hello;  // the hello, kept until its proof arrives
  std::string connector_nonce;
  std::string acceptor_nonce;
  int sender_pid = 0;  // non-zero: the same-host fast path is on for this stream
  std::array<uint64_t, 2> descriptor{};
  std::string out_pending;  // handshake answer and acknowledgements not yet written
  std::string out_flight;
  std::vector<char> staging;
  size_t begin = 0;
  size_t end = 0;
  Frame frame;
  Message pending;

  size_t buffered() const { return end - begin; }
  size_t discard_left = 0;  // bytes of a refused body still to read and drop

  // Consumes up to `n` staged bytes into `dst`; returns how many.
  size_t TakeStaged(char* dst, size_t n) {
    size_t k = std::min(n, buffered());
    if (k > 0) std::memcpy(dst, staging.data() + begin, k);
    begin += k;
    return k;
  }

  // A connection must introduce itself within hello_timeout, or it is closed: a stranger that
  // connects and says nothing (or half a frame) must not hold a descriptor for ever.
  void StartHelloDeadline() {
    hello_timer.expires_after(impl->options.hello_timeout);
    hello_timer.async_wait([self = shared_from_this()](const std::error_code& ec) {
      if (ec || self->greeted || !self->socket.is_open()) return;
      self->impl->DropStranger(self->remote,
                               "it did not complete the handshake within " +
                                   std::to_string(self->impl->options.hello_timeout.count()) +
                                   " ms (DTRAIN_HELLO_TIMEOUT_MS)");
      std::error_code ignored;
      self->socket.close(ignored);  // the pending read ends with operation_aborted: no report
    });
  }

  // Processes every complete message already staged, then reads more. Runs on an io thread; only
  // one read is outstanding per stream, so this is never entered twice at once.
  void Pump() {
    for (;;) {
      if (refused || !socket.is_open()) return;  // refused, or closed by a failure
      if (buffered() < kWireHeaderSize) return ReadMore();
      try {
        frame = DecodeHeader(staging.data() + begin, buffered(), impl->limits);
      } catch (const ProtocolError& e) {
        return Fail(std::string("it sent a malformed message: ") + e.what());
      }
      begin += kWireHeaderSize;
      pending = Message{};
      pending.header = frame.header;
      pending.meta.resize(frame.meta_len);
      size_t got = TakeStaged(pending.meta.data(), frame.meta_len);
      if (got < frame.meta_len) return ReadMeta(got);
      if (!StartBody()) return;
    }
  }

  void ReadMore() {
    if (begin > 0) {
      std::memmove(staging.data(), staging.data() + begin, buffered());
      end -= begin;
      begin = 0;
    }
    socket.async_read_some(asio::buffer(staging.data() + end, staging.size() - end),
                           [self = shared_from_this()](const std::error_code& ec, size_t n) {
                             if (ec) return self->Fail(ec);
                             self->end += n;
                             self->Pump();
                           });
  }

  void ReadMeta(size_t got) {
    asio::async_read(socket, asio::buffer(pending.meta.data() + got, frame.meta_len - got),
                     [self = shared_from_this()](const std::error_code& ec, size_t) {
                       if (ec) return self->Fail(ec);
                       if (self->StartBody()) self->Pump();
                     });
  }

  // Places the body; returns true if the message is complete (and dispatched) without a read.
  bool StartBody() {
    const size_t n = frame.body_len;
    if ((frame.header.flags & kFlagRemoteBody) != 0) return StartRemoteBody();
    if (n == 0) {
      Dispatch();
      return true;
    }
    if (BodyTooLong(n)) {
      discard_left = n - Skip(n);
      if (discard_left == 0) {
        Dispatch();
        return true;
      }
      begin = end = 0;  // everything staged was consumed
      DiscardMore();
      return false;
    }
    try {
      pending.body = Destination(n);
    } catch (const std::bad_alloc&) {
      Fail("there is no memory for its message of " + std::to_string(n) + " bytes");
      return false;
    }
    size_t got = TakeStaged(pending.body.data, n);
    if (got == n) {
      Dispatch();
      return true;
    }
    asio::async_read(socket, asio::buffer(pending.body.data + got, n - got),
                     [self = shared_from_this()](const std::error_code& ec, size_t) {
                       if (ec) return self->Fail(ec);
                       self->Dispatch();
                       self->Pump();
                     });
    return false;
  }

  // Whether the receiver's BodyLimit refuses a body of n bytes for the pending message; if so the
  // message is marked and will be delivered without it.
  bool BodyTooLong(size_t n) {
    if (!impl->body_limit) return false;
    const size_t limit = impl->body_limit(pending.header);
    if (n <= limit) return false;
    pending.header.flags |= kFlagBodyRefused;
    pending.meta = BodyRefusal(n, limit);
    return true;
  }

  size_t Skip(size_t n) {
    const size_t k = std::min(n, buffered());
    begin += k;
    return k;
  }

  // Reads and drops the rest of a refused body, through the (empty) staging buffer.
  void DiscardMore() {
    socket.async_read_some(asio::buffer(staging.data(), std::min(discard_left, staging.size())),
                           [self = shared_from_this()](const std::error_code& ec, size_t k) {
                             if (ec) return self->Fail(ec);
                             self->discard_left -= k;
                             if (self->discard_left > 0) return self->DiscardMore();
                             self->Dispatch();
                             self->Pump();
                           });
  }

  Body Destination(size_t n) {
    Body body;
    if (impl->body_sink) body = impl->body_sink(frame.header, n);
    if (body.data == nullptr || body.size < n) {
      auto buffer = BufferPool::Default().Get(n);
      body.data = buffer.get();
      body.owner = std::move(buffer);
    }
    body.size = n;
    return body;
  }

  // The body stays in the sender's memory: read the descriptor, copy, acknowledge.
  bool StartRemoteBody() {
    char* d = reinterpret_cast<char*>(descriptor.data());
    size_t got = TakeStaged(d, sizeof(descriptor));
    if (got == sizeof(descriptor)) return CopyRemoteBody();
    asio::async_read(socket, asio::buffer(d + got, sizeof(descriptor) - got),
                     [self = shared_from_this()](const std::error_code& ec, size_t) {
                       if (ec) return self->Fail(ec);
                       if (self->CopyRemoteBody()) self->Pump();
                     });
    return false;
  }

  bool CopyRemoteBody() {
    if (sender_pid == 0) {
      Fail(std::string("it sent a same-host body reference without the same-host handshake"));
      return false;
    }
    const size_t n = frame.body_len;
    if (BodyTooLong(n)) {  // nothing to copy; the sender still needs the acknowledgement
      pending.header.flags &= ~kFlagRemoteBody;
      Write(std::string(reinterpret_cast<const char*>(&descriptor[1]), 8));
      Dispatch();
      return true;
    }
    pending.body = Destination(n);
    if (!same_host::ReadRemote(sender_pid, descriptor[0], pending.body.data, n)) {
      Fail("copying a body out of its memory failed: " + std::string(std::strerror(errno)));
      return false;
    }
    pending.header.flags &= ~kFlagRemoteBody;
    Write(std::string(reinterpret_cast<const char*>(&descriptor[1]), 8));
    Dispatch();
    return true;
  }

  // Writes back on this stream (handshake answer, acknowledgements); on the stream's strand.
  void Write(std::string bytes) {
    out_pending += bytes;
    if (!out_flight.empty()) return;
    out_flight.swap(out_pending);
    asio::async_write(socket, asio::buffer(out_flight),
                      [self = shared_from_this()](const std::error_code& ec, size_t) {
                        self->out_flight.clear();
                        if (ec) return;  // the read side reports the failure
                        if (!self->out_pending.empty()) return self->Write({});
                        if (self->refused) self->Close();
                      });
  }

  // Answers a connection that is no member with the reason (so that a misconfigured node of the
  // job learns what is wrong), logs it as a stranger's, and closes once the answer is written.
  void Refuse(const std::string& code, const std::string& reason) {
    if (refused) return;
    refused = true;
    impl->DropStranger(remote, reason);
    Write(HandshakeFrame("dtrain-welcome 1 refused=" + code));
  }

  // A hello (before the handshake completed): greet it, or with a job secret, challenge it and then
  // check the proof that answers the challenge.
  void OnHandshake(Message&& msg) {
    const std::string& secret = impl->options.job_secret;
    const std::string nonce = auth::WordValue(msg.meta, "nonce");
    if (secret.empty()) {
      if (!nonce.empty()) {
        return Refuse("no-secret-here",
                      "it offered to authenticate, and DTRAIN_JOB_SECRET is not set here");
      }
      return Greet(msg);
    }
    if (!hello) {
      if (!IsNonce(nonce)) {
        return Refuse("secret-required",
                      "it did not authenticate (DTRAIN_JOB_SECRET is not set there, or it is no "
                      "node of this job)");
      }
      connector_nonce = nonce;
      acceptor_nonce = auth::NewNonce();
      const std::string proof =
          auth::Proof(secret, kAcceptorLabel, {connector_nonce, acceptor_nonce});
      hello = std::move(msg);
      return Write(
          HandshakeFrame("dtrain-challenge 1 nonce=" + acceptor_nonce + " proof=" + proof));
    }
    const std::string expected = auth::Proof(
        secret, kConnectorLabel,
        {acceptor_nonce, connector_nonce, std::to_string(hello->header.sender), hello->meta});
    if (!auth::ProofsEqual(expected, auth::WordValue(msg.meta, "proof"))) {
      return Refuse("bad-proof", "it failed authentication (its DTRAIN_JOB_SECRET differs)");
    }
    Message first = std::move(*hello);
    hello.reset();
    Greet(first);
  }

  // This connection's two ends, for the kernel's word on who holds the other one (IPv4 only: the
  // same-host path is off for anything else).
  same_host::ConnectionEnds Ends() const {
    same_host::ConnectionEnds ends;
    std::error_code e1, e2;
    const auto remote = socket.remote_endpoint(e1);
    const auto local = socket.local_endpoint(e2);
    if (e1 || e2 || !remote.address().is_v4() || !local.address().is_v4()) return ends;
    ends.peer_address = remote.address().to_v4().to_uint();
    ends.peer_port = remote.port();
    ends.our_address = local.address().to_v4().to_uint();
    ends.our_port = local.port();
    return ends;
  }

  // The handshake is complete: the stream belongs to the node its hello named; say whether the
  // same-host fast path can be used.
  void Greet(const Message& first) {
    greeted = true;
    hello_timer.cancel();
    if (first.header.sender >= 0) peer.store(first.header.sender);
    if (impl->options.same_host_direct && !first.meta.empty()) {
      sender_pid = same_host::ProbeHello(first.meta, Ends());
    }
    Write(HandshakeFrame(sender_pid != 0 ? "dtrain-welcome 1 direct=1"
                                         : "dtrain-welcome 1 direct=0"));
  }

  void Dispatch() {
    Message msg = std::move(pending);
    pending = Message{};
    if (LogEnabled(LogLevel::kMessages)) DTRAIN_LOG(kMessages) << "recv " << Describe(msg);
    if (!greeted) {
      if (msg.header.command == Command::kHello) return OnHandshake(std::move(msg));
      return Fail(std::string("it sent a message before completing the handshake"));
    }
    if (msg.header.command == Command::kHello) return;  // a repeated hello changes nothing
    // Identity comes from the connection: the first id it used, never a later claim.
    const NodeId known = peer.load();
    if (known == kNoNode) {
      if (msg.header.sender >= 0) peer.store(msg.header.sender);
    } else if (msg.header.sender != known && msg.header.sender != kNoNode) {
      return Fail("it sent a message as node " + std::to_string(msg.header.sender) +
                  " on the connection of node " + std::to_string(known));
    }
    if (msg.header.command == Command::kBye) {
      said_bye = true;
      if (peer.load() != kNoNode) impl->MarkDeparted(peer.load());
      return;
    }
    try {
      impl->on_message(std::move(msg));
    } catch (const std::exception& e) {
      DTRAIN_LOG(kError) << "message handler failed: " << e.what();
    }
  }

  void Fail(const std::error_code& ec) {
    if (said_bye || impl->shutting_down.load() || ec == asio::error::operation_aborted) {
      Close();
      return;
    }
    Fail(ec == asio::error::eof ? std::string("its connection closed (the process exited or died)")
                                : "reading from it failed: " + ec.message());
  }

  void Fail(const std::string& reason) {
    Close();
    // A connection that never said Hello is no node of the job (a port scan, a health check, a
    // stray client): its end or its garbage must not count as a member's failure.
    if (!greeted) return impl->DropStranger(remote, reason);
    impl->ReportLost(peer.load(), remote, reason);
  }

  void Close() {
    std::error_code ignored;
    hello_timer.cancel();
    socket.close(ignored);
    impl->Forget(shared_from_this());
  }
};

void TcpTransport::Impl::StartThreads() {
  work.emplace(io.get_executor());
  for (int i = 0; i < std::max(1, options.io_threads); ++i) {
    threads.emplace_back([this] {
      // A handler that throws must not end the process (it is the user's): log it, run on.
      for (;;) {
        try {
          io.run();
          return;
        } catch (const std::exception& e) {
          DTRAIN_LOG(kError) << "transport: an I/O handler failed: " << e.what();
        }
      }
    });
  }
}

void TcpTransport::Impl::Accept() {
  // Each accepted socket gets its own strand, so that closing it at shutdown is serialised with its
  // read handlers.
  acceptor.async_accept(
      asio::make_strand(io), [this](const std::error_code& ec, tcp::socket socket) {
        if (ec) {
          if (ec != asio::error::operation_aborted && !shutting_down.load()) {
            DTRAIN_LOG(kError) << "accepting a connection failed: " << ec.message();
          }
          if (ec == asio::error::operation_aborted || shutting_down.load()) return;
          return Accept();
        }
        std::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        SetLinkTimeout(socket, options.link_timeout);
        auto stream = std::make_shared<InStream>(this, std::move(socket));
        DTRAIN_LOG(kConnections) << "accepted a connection from " << stream->remote;
        {
          std::lock_guard<std::mutex> lock(mutex);
          incoming.insert(stream);
        }
        stream->StartHelloDeadline();
        stream->Pump();
        Accept();
      });
}

void TcpTransport::Impl::ReportLost(NodeId peer, const std::string& remote,
                                    const std::string& reason) {
  if (shutting_down.load()) return;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (departed.count(peer) != 0) return;
    if (peer != kNoNode && !lost.insert(peer).second) return;
  }
  if (on_peer_lost) on_peer_lost(peer, remote, reason);
}

void TcpTransport::Impl::DropStranger(const std::string& remote, const std::string& reason) {
  if (shutting_down.load()) return;
  // Logged, but rate-limited: a scanner or a flood must not fill the job's output.
  const uint64_t n = ++strangers_dropped;
  if (n <= 10 || n % 1000 == 0) {
    DTRAIN_LOG(kWarning) << "dropped a connection from " << remote
                         << " that never introduced itself as a node of this job: " << reason
                         << " (" << n << (n == 1 ? " such connection" : " such connections")
                         << (n >= 10 ? " so far; every 1000th is logged)" : " so far)");
  }
}

TcpTransport::TcpTransport(TcpOptions options) : impl_(std::make_unique<Impl>(options)) {
  impl_->StartThreads();
}

TcpTransport::~TcpTransport() { Shutdown(Deadline(Duration(2000))); }

void TcpTransport::SetBodyLimit(BodyLimit limit) { impl_->body_limit = std::move(limit); }

void TcpTransport::SetHandlers(MessageHandler on_message, PeerLostHandler on_peer_lost,
                               BodySink body_sink) {
  impl_->on_message = std::move(on_message);
  impl_->on_peer_lost = std::move(on_peer_lost);
  impl_->body_sink = std::move(body_sink);
}

uint16_t TcpTransport::Listen(const std::string& host, uint16_t port) {
  std::error_code ec;
  asio::ip::address address = host.empty() ? asio::ip::address(asio::ip::address_v4::any())
                                           : asio::ip::make_address(host, ec);
  if (ec) throw Error("cannot listen on '" + host + "': not an IP address (" + ec.message() + ")");
  tcp::endpoint endpoint(address, port);
  auto& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::error_code ignored;
    acceptor.close(ignored);  // so that the caller may try another address
    throw Error("cannot listen on " + (host.empty() ? std::string("*") : host) + ":" +
                std::to_string(port) + ": " + ec.message());
  }
  const uint16_t bound = acceptor.local_endpoint().port();
  asio::post(impl_->io, [impl = impl_.get()] { impl->Accept(); });
  DTRAIN_LOG(kConnections) << "listening on " << (host.empty() ? "*" : host) << ":" << bound;
  return bound;
}

namespace {

// Reads exactly buffer's size within the deadline (the peer may be a stranger that stalls).
void ReadWithDeadline(tcp::socket& socket, asio::mutable_buffer buffer, const Deadline& deadline) {
  auto done = std::make_shared<std::promise<std::error_code>>();
  auto result = done->get_future();
  asio::async_read(socket, buffer,
                   [done](const std::error_code& e, size_t) { done->set_value(e); });
  if (result.wait_until(deadline.at()) != std::future_status::ready) {
    asio::post(socket.get_executor(), [&socket] {
      std::error_code ignored;
      socket.cancel(ignored);
    });
    result.wait();
    throw TimeoutError("no answer to the hello");
  }
  if (std::error_code ec = result.get()) {
    throw PeerError("reading the answer to the hello failed: " + ec.message());
  }
}

// One handshake frame from the accepting side: its meta.
std::string ReadHandshakeAnswer(tcp::socket& socket, const Deadline& deadline,
                                const Limits& limits) {
  std::array<char, kWireHeaderSize> header{};
  ReadWithDeadline(socket, asio::buffer(header), deadline);
  Frame f = DecodeHeader(header.data(), header.size(), limits);
  if (f.header.command != Command::kHello || f.meta_len > kMaxHandshakeMeta || f.body_len != 0) {
    throw ProtocolError("the peer answered the hello with something else");
  }
  std::string meta(f.meta_len, '\0');
  ReadWithDeadline(socket, asio::buffer(meta.data(), meta.size()), deadline);
  return meta;
}

void WriteFrame(tcp::socket& socket, const Message& msg) {
  WireHeader header = EncodeHeader(msg.header, msg.meta.size(), 0);
  std::error_code ec;
  asio::write(socket,
              std::array<asio::const_buffer, 2>{asio::buffer(header), asio::buffer(msg.meta)}, ec);
  if (ec) throw PeerError("sending the hello failed: " + ec.message());
}

// What a refusal means, said from the connecting side.
std::string RefusalText(const std::string& code) {
  if (code == "secret-required") {
    return "it requires DTRAIN_JOB_SECRET, which is not set here: set the same secret on every "
           "node of the job";
  }
  if (code == "no-secret-here") {
    return "DTRAIN_JOB_SECRET is set here but not there: set the same secret on every node";
  }
  if (code == "bad-proof") return "it rejected our proof: its DTRAIN_JOB_SECRET differs from ours";
  return "it refused the connection (" + code + ")";
}

// Sends the hello on a fresh connection, authenticates both ways when there is a job secret, and
// reads the welcome; true if the same-host fast path is on for the stream. Throws
// HandshakeRefused when retrying cannot help, another Error on failure or at the deadline.
bool Handshake(tcp::socket& socket, NodeId peer, NodeId self, const Deadline& deadline,
               const TcpOptions& options, const Limits& limits) {
  const std::string& secret = options.job_secret;
  Message hello;
  hello.header.command = Command::kHello;
  hello.header.sender = self;
  hello.header.recipient = peer;
  if (options.same_host_direct) hello.meta = same_host::EncodeHello();
  const std::string nonce = secret.empty() ? "" : auth::NewNonce();
  if (!secret.empty()) hello.meta += (hello.meta.empty() ? "nonce=" : " nonce=") + nonce;
  WriteFrame(socket, hello);

  std::string answer = ReadHandshakeAnswer(socket, deadline, limits);
  if (std::string refusal = auth::WordValue(answer, "refused"); !refusal.empty()) {
    throw HandshakeRefused(RefusalText(refusal));
  }
  if (!secret.empty()) {
    const std::string their_nonce = auth::WordValue(answer, "nonce");
    if (answer.rfind("dtrain-challenge 1 ", 0) != 0 || !IsNonce(their_nonce)) {
      throw HandshakeRefused(
          "it did not answer our authentication: DTRAIN_JOB_SECRET is not set there, or it is no "
          "node of this job");
    }
    const std::string expected = auth::Proof(secret, kAcceptorLabel, {nonce, their_nonce});
    if (!auth::ProofsEqual(expected, auth::WordValue(answer, "proof"))) {
      throw HandshakeRefused(
          "it does not know this job's DTRAIN_JOB_SECRET (another job's node, or a stranger, "
          "listens there)");
    }
    Message proof;
    proof.header.command = Command::kHello;
    proof.header.sender = self;
    proof.header.recipient = peer;
    proof.meta = "proof=" + auth::Proof(secret, kConnectorLabel,
                                        {their_nonce, nonce, std::to_string(self), hello.meta});
    WriteFrame(socket, proof);
    answer = ReadHandshakeAnswer(socket, deadline, limits);
    if (std::string refusal = auth::WordValue(answer, "refused"); !refusal.empty()) {
      throw HandshakeRefused(RefusalText(refusal));
    }
  }
  if (answer.rfind("dtrain-welcome 1 ", 0) != 0) {
    throw HandshakeRefused("it answered the hello with something else: is it a dtrain node?");
  }
  return auth::WordValue(answer, "direct") == "1";
}

}  // namespace

void TcpTransport::Connect(NodeId peer, const Endpoint& endpoint, NodeId self, Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (self != kNoNode) impl_->self = self;
    if (impl_->links.count(peer) != 0 && impl_->lost.count(peer) == 0) return;
  }
  const int streams = self == kNoNode ? 1 : std::max(1, impl_->options.streams_per_peer);
  std::vector<std::shared_ptr<Impl::OutStream>> opened;
  std::string last_error = "no attempt was made";
  for (int i = 0; i < streams; ++i) {
    for (;;) {
      if (deadline.passed()) {
        throw TimeoutError("could not connect to " + endpoint.ToString() + " within " +
                           std::to_string(Seconds(deadline.timeout())) + " s: " + last_error);
      }
      std::error_code ec;
      tcp::resolver resolver(impl_->io);
      auto results = resolver.resolve(endpoint.host, std::to_string(endpoint.port), ec);
      if (ec) {
        last_error = "cannot resolve '" + endpoint.host + "': " + ec.message();
        std::this_thread::sleep_for(std::min(Duration(200), deadline.left()));
        continue;
      }
      auto socket = std::make_shared<tcp::socket>(asio::make_strand(impl_->io));
      auto done = std::make_shared<std::promise<std::error_code>>();
      auto result = done->get_future();
      asio::async_connect(
          *socket, results,
          [socket, done](const std::error_code& e, const tcp::endpoint&) { done->set_value(e); });
      if (result.wait_until(deadline.at()) != std::future_status::ready) {
        asio::post(socket->get_executor(), [socket] {
          std::error_code ignored;
          socket->close(ignored);
        });
        result.wait();
        last_error = "connecting timed out";
        continue;
      }
      ec = result.get();
      if (ec) {
        last_error = ec.message();
        std::this_thread::sleep_for(std::min(Duration(50), deadline.left()));
        continue;
      }
      socket->set_option(tcp::no_delay(true), ec);
      SetLinkTimeout(*socket, impl_->options.link_timeout);
      bool direct = false;
      try {
        direct = Handshake(*socket, peer, self, deadline, impl_->options, impl_->limits);
      } catch (const HandshakeRefused& e) {
        throw PeerError("cannot connect to " + endpoint.ToString() + ": " + e.what());
      } catch (const Error& e) {
        last_error = e.what();
        continue;
      }
      auto stream =
          std::make_shared<Impl::OutStream>(impl_.get(), peer, std::move(*socket), direct);
      stream->ReadAcks();
      opened.push_back(std::move(stream));
      break;
    }
  }
  const bool direct = !opened.empty() && opened.front()->direct;
  DTRAIN_LOG(kConnections) << "connected to node " << peer << " at " << endpoint.ToString()
                           << " over " << streams << " stream(s)"
                           << (direct ? ", same-host direct copies on" : "");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->links[peer] = std::move(opened);
  impl_->lost.erase(peer);
  impl_->departed.erase(peer);
}

void TcpTransport::Send(NodeId peer, Message msg) {
  std::shared_ptr<Impl::OutStream> stream;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto it = impl_->links.find(peer);
    if (it == impl_->links.end() || it->second.empty()) {
      throw PeerError("no connection to node " + std::to_string(peer));
    }
    const auto& streams = it->second;
    // Pieces of one value (parts) spread over the streams; one (key, part) always uses the same.
    const uint64_t h = msg.header.key * 0x9E3779B97F4A7C15ull + msg.header.part;
    stream = streams[streams.size() == 1 ? 0 : h % streams.size()];
  }
  if (LogEnabled(LogLevel::kMessages)) DTRAIN_LOG(kMessages) << "send " << Describe(msg);
  stream->Enqueue(std::move(msg));
}

bool TcpTransport::IsConnected(NodeId peer) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->links.count(peer) != 0 && impl_->lost.count(peer) == 0;
}

void TcpTransport::Shutdown(Deadline deadline) {
  std::vector<std::shared_ptr<Impl::OutStream>> outs;
  NodeId self;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;
    for (auto& [peer, streams] : impl_->links)
      outs.insert(outs.end(), streams.begin(), streams.end());
    self = impl_->self;
  }
  for (auto& stream : outs) {
    Message bye;
    bye.header.command = Command::kBye;
    bye.header.sender = self;
    bye.header.recipient = stream->peer;
    stream->Enqueue(std::move(bye));
  }
  for (auto& stream : outs) stream->WaitDrained(deadline);
  impl_->shutting_down.store(true);
  // Closing on each socket's own strand aborts its pending operations without racing its handlers;
  // once all are closed the io threads run out of work and return.
  asio::post(impl_->acceptor.get_executor(), [impl = impl_.get()] {
    std::error_code ignored;
    impl->acceptor.close(ignored);
  });
  for (auto& stream : outs) {
    asio::post(stream->socket.get_executor(), [stream] {
      std::error_code ignored;
      stream->socket.close(ignored);
    });
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (auto& stream : impl_->incoming) {
      asio::post(stream->socket.get_executor(), [stream] {
        std::error_code ignored;
        stream->socket.close(ignored);
      });
    }
  }
  impl_->work.reset();
  for (auto& t : impl_->threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // Shutdown from a handler: the thread ends when the handler returns
    } else if (t.joinable()) {
      t.join();
    }
  }
  impl_->threads.clear();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->links.clear();
  impl_->incoming.clear();
}

}  // namespace dtrain::transport

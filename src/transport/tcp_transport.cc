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

#include "auth/job_auth.h"
#include "common/buffer_pool.h"
#include "common/logging.h"
#include "dtrain/common/error.h"
#include "transport/same_host.h"
#include "transport/tcp_handshake.h"
#include "transport/tcp_transport_impl.h"

namespace dtrain::transport {

using asio::ip::tcp;

namespace {

constexpr size_t kStagingBytes = 64 * 1024;
// How long an acceptor may sit on received messages before acknowledging them on the
// acknowledgement channel (PS_RESEND), when no message of ours going back carried the count first:
// the sender keeps each message until then. Each such acknowledgement wakes both sides (acking
// every 1 MB message at once cost 80% of a 1 MB pushpull here), so they are rare.
constexpr Duration kAckDelay{20};
// ... unless they carried at least this many body bytes: then at once, bounding what is held.
constexpr size_t kAckBytes = size_t{64} << 20;

using tcp_handshake::RemoteOf;
using tcp_handshake::SetLinkTimeout;

// Sets the connection's congestion control; a kernel without the algorithm, or one that does not
// allow it to this process (net.ipv4.tcp_allowed_congestion_control), leaves its default, said
// once per process.
void UseCongestionControl(tcp::socket& socket, const std::string& name) {
  if (::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_CONGESTION, name.data(),
                   static_cast<socklen_t>(name.size())) == 0) {
    return;
  }
  static std::once_flag warned;
  const int error = errno;
  std::call_once(warned, [&] {
    DTRAIN_LOG(kWarning) << "TCP congestion control '" << name
                         << "' (DTRAIN_TCP_LOCAL_CONGESTION) is not available here ("
                         << std::strerror(error)
                         << "; see net.ipv4.tcp_allowed_congestion_control): connections within "
                            "this host keep the kernel's default";
  });
}

// Whether both ends of a connection are this host (an address of the peer that is loopback or
// the socket's own); false when either end cannot be read.
bool ConnectionStaysOnThisHost(const tcp::socket& socket) {
  std::error_code no_local, no_remote;
  const auto local = socket.local_endpoint(no_local);
  const auto remote = socket.remote_endpoint(no_remote);
  return !no_local && !no_remote && tcp_handshake::StaysOnThisHost(local, remote);
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
  options.resend = config.resend;
  options.resend_timeout = config.resend_timeout;
  options.resend_window = config.resend_window;
  options.notsent_lowat = config.tcp_notsent_lowat;
  options.send_buffer = config.tcp_send_buffer;
  options.local_congestion =
      config.tcp_local_congestion == "system" ? "" : config.tcp_local_congestion;
  return options;
}

// One connection we read from: header, meta, body, hand the message over, repeat.
struct TcpTransport::Impl::InStream : std::enable_shared_from_this<InStream> {
  InStream(Impl* impl, tcp::socket socket)
      : impl(impl),
        socket(std::move(socket)),
        remote(RemoteOf(this->socket)),
        hello_timer(this->socket.get_executor()),
        ack_timer(this->socket.get_executor()) {
    staging.resize(kStagingBytes);
  }

  Impl* const impl;
  tcp::socket socket;
  const std::string remote;
  // On the socket's strand, as every handler of the stream. The hello's deadline, and once the
  // connection broke, the resend window's (PS_RESEND).
  asio::steady_timer hello_timer;
  asio::steady_timer ack_timer;  // PS_RESEND: acknowledges what arrived since it was set
  bool ack_armed = false;
  size_t unacked_bytes = 0;
  // PS_RESEND, when the connector asked for it: which of its link's streams this is, and the
  // stream's count of messages received, shared with the connections that carried it before.
  int stream_index = -1;
  std::shared_ptr<Inbound> inbound;
  std::weak_ptr<OutStream> reverse;  // our stream back to the peer with the same index
  std::atomic<NodeId> peer{kNoNode};
  bool said_bye = false;
  bool greeted = false;  // the handshake is complete: messages count from now on
  bool refused = false;  // a refusal is being written; the stream closes after it
  // With a job secret, between the hello and the connector's proof:
  std::optional<Message> hello;                      // the hello, kept until its proof arrives
  std::optional<auth::AcceptorHandshake> challenge;  // this stream's side of the exchange
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
    Write(tcp_handshake::Frame("dtrain-welcome 1 refused=" + code));
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
      challenge.emplace(secret, tcp_handshake::kLabels);
      const std::optional<auth::Challenge> sent = challenge->OnHello(nonce);
      if (!sent) {
        return Refuse("secret-required",
                      "it did not authenticate (DTRAIN_JOB_SECRET is not set there, or it is no "
                      "node of this job)");
      }
      hello = std::move(msg);
      return Write(tcp_handshake::Frame("dtrain-challenge 1 nonce=" + sent->nonce +
                                        " proof=" + sent->proof));
    }
    if (!challenge->Verify(auth::WordValue(msg.meta, "proof"),
                           {std::to_string(hello->header.sender), hello->meta})) {
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
    std::string welcome =
        sender_pid != 0 ? "dtrain-welcome 1 direct=1" : "dtrain-welcome 1 direct=0";
    if (impl->options.resend) {
      const std::string index = auth::WordValue(first.meta, "stream");
      if (!index.empty() && index.size() <= 3 &&
          index.find_first_not_of("0123456789") == std::string::npos) {
        stream_index = std::stoi(index);
        const bool resume = auth::WordValue(first.meta, "resume") == "1";
        welcome += " resend=1 delivered=" + std::to_string(Carry(first.header.sender, resume));
      }
    }
    Write(tcp_handshake::Frame(welcome));
  }

  // Makes this connection the carrier of its stream (PS_RESEND): a resumed stream continues its
  // count, a new one starts at 0. Returns how many messages the stream has delivered.
  uint64_t Carry(NodeId sender, bool resume) {
    std::shared_ptr<Inbound> state;
    if (sender >= 0) {
      std::lock_guard<std::mutex> lock(impl->mutex);
      auto& slot = impl->inbound[{sender, stream_index}];
      if (!slot || !resume) slot = std::make_shared<Inbound>();
      state = slot;
    } else {
      state = std::make_shared<Inbound>();  // registered once the sender's id is known
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    state->carrier = this;
    inbound = state;
    return state->delivered;
  }

  // The stream we write back to the peer on with this stream's index: requests and their replies
  // take the same index both ways, so the counts it carries are what the peer waits on.
  std::shared_ptr<OutStream> Reverse() {
    if (auto out = reverse.lock()) return out;
    const NodeId from = peer.load();
    if (from == kNoNode) return nullptr;
    std::lock_guard<std::mutex> lock(impl->mutex);
    auto it = impl->links.find(from);
    if (it == impl->links.end() || stream_index >= static_cast<int>(it->second.size())) {
      return nullptr;
    }
    reverse = it->second[stream_index];
    return it->second[stream_index];
  }

  // Whether this connection still carries its stream (not resumed on another since).
  bool Carries() {
    if (!inbound) return true;
    std::lock_guard<std::mutex> lock(inbound->mutex);
    return inbound->carrier == this;
  }

  // Counts an arriving message (PS_RESEND) and sees that the count reaches the sender soon; false
  // if another connection carries the stream now, and this one must deliver nothing more (what it
  // still held is resent there).
  bool Count(size_t body_bytes) {
    uint64_t delivered;
    {
      std::lock_guard<std::mutex> lock(inbound->mutex);
      if (inbound->carrier != this) {
        Close();
        return false;
      }
      delivered = ++inbound->delivered;
    }
    if (auto out = Reverse()) out->reverse_delivered.store(delivered);
    unacked_bytes += body_bytes;
    if (unacked_bytes >= kAckBytes) {
      unacked_bytes = 0;
      WriteDelivered(delivered);
    }
    if (!ack_armed) {
      ack_armed = true;
      ack_timer.expires_after(kAckDelay);
      ack_timer.async_wait([self = shared_from_this()](const std::error_code& ec) {
        self->ack_armed = false;
        self->unacked_bytes = 0;
        if (ec || !self->socket.is_open()) return;
        uint64_t delivered;
        {
          std::lock_guard<std::mutex> lock(self->inbound->mutex);
          if (self->inbound->carrier != self.get()) return;
          delivered = self->inbound->delivered;
        }
        self->WriteDelivered(delivered);
      });
    }
    return true;
  }

  // The stream's count of messages received, on the acknowledgement channel.
  void WriteDelivered(uint64_t delivered) {
    const uint64_t word = delivered | kDeliveredBit;
    Write(std::string(reinterpret_cast<const char*>(&word), sizeof word));
  }

  void Dispatch() {
    Message msg = std::move(pending);
    pending = Message{};
    if (LogEnabled(LogLevel::kMessages)) DTRAIN_LOG(kMessages) << "recv " << Describe(msg);
    if (!greeted) {
      if (msg.header.command == Command::kHello) return OnHandshake(std::move(msg));
      return Fail(std::string("it sent a message before completing the handshake"));
    }
    if (msg.header.command == Command::kAck) {  // not counted: it is no message of the stream
      if (stream_index >= 0) {
        if (auto out = Reverse()) out->Acknowledge(msg.header.request_id);
      }
      return;
    }
    if (inbound && !Count(msg.body.size)) return;
    if (msg.header.command == Command::kHello) return;  // a repeated hello changes nothing
    // Identity comes from the connection: the first id it used, never a later claim.
    const NodeId known = peer.load();
    if (known == kNoNode) {
      if (msg.header.sender >= 0) {
        peer.store(msg.header.sender);
        if (inbound) {
          std::lock_guard<std::mutex> lock(impl->mutex);
          impl->inbound[{msg.header.sender, stream_index}] = inbound;
        }
      }
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
    // Even a clean close may be the network's doing (a reset reads as one once a write has taken
    // the error): with PS_RESEND the peer gets the window to resume. If its process ended, our
    // own link to it finds nothing listening and reports it at once.
    Lose(ec == asio::error::eof ? std::string("its connection closed (the process exited or died)")
                                : "reading from it failed: " + ec.message(),
         true);
  }

  void Fail(const std::string& reason) { Lose(reason, false); }

  void Lose(const std::string& reason, bool may_resume) {
    // A connection that never said Hello is no node of the job (a port scan, a health check, a
    // stray client): its end or its garbage must not count as a member's failure.
    if (!greeted) {
      Close();
      return impl->DropStranger(remote, reason);
    }
    // One that another connection has taken over from ends quietly.
    if (!Carries()) return Close();
    if (may_resume && inbound && peer.load() != kNoNode) return AwaitResume(reason);
    Close();
    impl->ReportLost(peer.load(), remote, reason);
  }

  // PS_RESEND: the peer's side re-establishes the stream if it can; it is lost only if it has
  // not within the window. The stream stays among the incoming ones so that shutdown ends the wait.
  void AwaitResume(const std::string& reason) {
    std::error_code ignored;
    socket.close(ignored);
    const auto window = impl->options.resend_window;
    DTRAIN_LOG(kWarning) << "lost the connection from node " << peer.load() << " at " << remote
                         << " (" << reason << "); waiting up to " << window.count()
                         << " ms for it to reconnect (PS_RESEND)";
    hello_timer.expires_after(window);
    hello_timer.async_wait([self = shared_from_this(), reason, window](const std::error_code& ec) {
      const bool still_carrier = self->Carries();
      self->Close();
      if (ec || !still_carrier) return;  // shut down, or resumed on another connection
      self->impl->ReportLost(self->peer.load(), self->remote,
                             reason + "; it did not reconnect within " +
                                 std::to_string(window.count()) + " ms (DTRAIN_RESEND_WINDOW_MS)");
    });
  }

  void Close() {
    std::error_code ignored;
    hello_timer.cancel();
    ack_timer.cancel();
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

std::pair<tcp::socket, tcp_handshake::Welcome> TcpTransport::Impl::Open(
    NodeId peer, const Endpoint& endpoint, NodeId self, tcp_handshake::StreamIdentity stream,
    const Deadline& deadline) {
  tcp::socket socket = tcp_handshake::Dial(io, endpoint.host, endpoint.port, deadline);
  std::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  SetLinkTimeout(socket, options.link_timeout);
  auto welcome = tcp_handshake::Handshake(socket, peer, self, stream, deadline, options, limits);
  if (options.notsent_lowat > 0) {  // our data goes out on this socket (see OutStream)
    const int lowat = static_cast<int>(std::min<size_t>(options.notsent_lowat, INT32_MAX));
    ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat);
  }
  if (options.send_buffer > 0 || !options.local_congestion.empty()) {
    const bool stays = ConnectionStaysOnThisHost(socket);
    // The cap is for links: on loopback a buffer smaller than one 64 KiB segment only adds
    // wake-ups (LeNet on one host trained 1.5-1.6x slower with 32 KiB).
    if (options.send_buffer > 0 && options.send_buffer != Config::kAdaptiveSendBuffer && !stays) {
      SetSendBuffer(socket.native_handle(), options.send_buffer);
    }
    if (!options.local_congestion.empty() && stays) {
      UseCongestionControl(socket, options.local_congestion);
    }
  }
  return {std::move(socket), welcome};
}

std::unique_ptr<SendBufferTuner> TcpTransport::Impl::SendBufferTunerFor(tcp::socket& socket) const {
  if (options.send_buffer != Config::kAdaptiveSendBuffer || ConnectionStaysOnThisHost(socket))
    return {};
  return std::make_unique<SendBufferTuner>(socket.native_handle());
}

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
      try {
        auto [socket, welcome] = impl_->Open(peer, endpoint, self, {i, false}, deadline);
        auto stream = std::make_shared<Impl::OutStream>(impl_.get(), peer, endpoint, i,
                                                        std::move(socket), welcome);
        stream->ReadAcks();
        opened.push_back(std::move(stream));
        break;
      } catch (const tcp_handshake::Refused& e) {
        throw PeerError("cannot connect to " + endpoint.ToString() + ": " + e.what());
      } catch (const Error& e) {
        last_error = e.what();  // not listening yet, or the network: try again
        std::this_thread::sleep_for(std::min(Duration(50), deadline.left()));
      }
    }
  }
  const bool direct = !opened.empty() && opened.front()->direct;
  DTRAIN_LOG(kConnections) << "connected to node " << peer << " at " << endpoint.ToString()
                           << " over " << streams << " stream(s)"
                           << (direct ? ", same-host direct copies on" : "")
                           << (!opened.empty() && opened.front()->resend ? ", resending" : "");
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
  std::vector<std::thread> reconnectors;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->shutting_down.store(true);
    reconnectors.swap(impl_->reconnectors);
  }
  impl_->stopping.notify_all();
  for (auto& t : reconnectors) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // only if a reconnector's report led to this shutdown
    } else if (t.joinable()) {
      t.join();
    }
  }
  // Closing on each socket's own strand aborts its pending operations without racing its handlers;
  // once all are closed the io threads run out of work and return.
  asio::post(impl_->acceptor.get_executor(), [impl = impl_.get()] {
    std::error_code ignored;
    impl->acceptor.close(ignored);
  });
  for (auto& stream : outs) stream->Close();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (auto& stream : impl_->incoming) {
      asio::post(stream->socket.get_executor(), [stream] {
        std::error_code ignored;
        stream->hello_timer.cancel();  // ends a wait for the peer to resume (PS_RESEND)
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

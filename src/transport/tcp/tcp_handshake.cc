#include "transport/tcp/tcp_handshake.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <array>
#include <future>
#include <memory>
#include <optional>

#include "auth/job_auth.h"
#include "transport/tcp/same_host.h"
#include "transport/tcp/tcp_transport.h"

namespace dtrain::transport::tcp_handshake {

using asio::ip::tcp;

std::string Frame(const std::string& meta) {
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

std::string RemoteOf(const tcp::socket& socket) {
  std::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  if (ec) return "(unknown)";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

bool StaysOnThisHost(const tcp::endpoint& local, const tcp::endpoint& remote) {
  return remote.address().is_loopback() || remote.address() == local.address();
}

tcp::socket Dial(asio::io_context& io, const std::string& host, uint16_t port,
                 const Deadline& deadline) {
  std::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec == asio::error::host_not_found || ec == asio::error::host_not_found_try_again) {
    throw Unresolvable("cannot resolve '" + host + "': " + ec.message());
  }
  if (ec) throw PeerError("cannot resolve '" + host + "': " + ec.message());
  // Its own strand, so that closing it is serialised with its handlers.
  auto socket = std::make_shared<tcp::socket>(asio::make_strand(io));
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
    throw TimeoutError("connecting timed out");
  }
  ec = result.get();
  if (ec == asio::error::connection_refused) throw NobodyListens(ec.message());
  if (ec) throw PeerError(ec.message());
  // A port in the ephemeral range that nobody listens on yet can be given to our own socket as
  // its source port: TCP's simultaneous open then connects the socket to itself. That is nobody
  // listening, and the caller retries; the handshake would fail on it in a misleading way.
  std::error_code local_ec, remote_ec;
  const tcp::endpoint local = socket->local_endpoint(local_ec);
  if (!local_ec && local == socket->remote_endpoint(remote_ec) && !remote_ec) {
    socket->close(local_ec);
    throw NobodyListens("nobody listens there yet (the connection reached itself)");
  }
  return std::move(*socket);
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
std::string ReadAnswer(tcp::socket& socket, const Deadline& deadline, const Limits& limits) {
  std::array<char, kWireHeaderSize> header{};
  ReadWithDeadline(socket, asio::buffer(header), deadline);
  ::dtrain::transport::Frame f = DecodeHeader(header.data(), header.size(), limits);
  if (f.header.command != Command::kHello || f.meta_len > kMaxMeta || f.body_len != 0) {
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

void ThrowIfRefused(const std::string& answer) {
  if (std::string refusal = auth::WordValue(answer, "refused"); !refusal.empty()) {
    throw Refused(RefusalText(refusal));
  }
}

// The hello's meta: the same-host probe, the stream's identity when resending, and a nonce.
std::string HelloMeta(StreamIdentity stream, const std::string& nonce, const TcpOptions& options) {
  std::string meta = options.same_host_direct ? same_host::EncodeHello() : "";
  auto add = [&meta](const std::string& word) { meta += (meta.empty() ? "" : " ") + word; };
  if (options.resend) {
    add("stream=" + std::to_string(stream.index));
    if (stream.resume) add("resume=1");
  }
  if (!nonce.empty()) add("nonce=" + nonce);
  return meta;
}

uint64_t ParseCount(const std::string& text) {
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != text.npos) {
    throw ProtocolError("the peer's welcome has a malformed count '" + text + "'");
  }
  return std::stoull(text);
}

}  // namespace

Welcome Handshake(tcp::socket& socket, NodeId peer, NodeId self, StreamIdentity stream,
                  const Deadline& deadline, const TcpOptions& options, const Limits& limits) {
  const std::string& secret = options.job_secret;
  Message hello;
  hello.header.command = Command::kHello;
  hello.header.sender = self;
  hello.header.recipient = peer;
  std::optional<auth::ConnectorHandshake> handshake;
  if (!secret.empty()) handshake.emplace(secret, kLabels);
  hello.meta = HelloMeta(stream, handshake ? handshake->nonce() : "", options);
  WriteFrame(socket, hello);

  std::string answer = ReadAnswer(socket, deadline, limits);
  ThrowIfRefused(answer);
  if (handshake) {
    const std::string their_nonce = auth::WordValue(answer, "nonce");
    if (answer.rfind("dtrain-challenge 1 ", 0) != 0 || !auth::IsNonce(their_nonce)) {
      throw Refused(
          "it did not answer our authentication: DTRAIN_JOB_SECRET is not set there, or it is no "
          "node of this job");
    }
    const std::optional<std::string> our_proof = handshake->Answer(
        their_nonce, auth::WordValue(answer, "proof"), {std::to_string(self), hello.meta});
    if (!our_proof) {
      throw Refused(
          "it does not know this job's DTRAIN_JOB_SECRET (another job's node, or a stranger, "
          "listens there)");
    }
    Message proof;
    proof.header.command = Command::kHello;
    proof.header.sender = self;
    proof.header.recipient = peer;
    proof.meta = "proof=" + *our_proof;
    WriteFrame(socket, proof);
    answer = ReadAnswer(socket, deadline, limits);
    ThrowIfRefused(answer);
  }
  if (answer.rfind("dtrain-welcome 1 ", 0) != 0) {
    throw Refused("it answered the hello with something else: is it a dtrain node?");
  }
  Welcome welcome;
  welcome.direct = auth::WordValue(answer, "direct") == "1";
  welcome.resend = options.resend && auth::WordValue(answer, "resend") == "1";
  if (welcome.resend) welcome.delivered = ParseCount(auth::WordValue(answer, "delivered"));
  return welcome;
}

}  // namespace dtrain::transport::tcp_handshake

#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <asio.hpp>
#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "dtrain/common/error.h"
#include "transport/tcp/in_stream.h"
#include "transport/tcp/out_stream.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/tcp/tcp_transport_impl.h"

namespace dtrain::transport {

using asio::ip::tcp;

namespace {

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

void TcpTransport::Impl::ReportLost(NodeId peer, uint64_t seen, const std::string& remote,
                                    const std::string& reason) {
  if (peer != kNoNode && IncarnationOf(peer) != seen) {
    DTRAIN_LOG(kConnections) << "a connection of node " << peer << "'s earlier process ended ("
                             << reason << "); it was replaced";
    return;
  }
  ReportLost(peer, remote, reason);
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
  bool told_unresolved = false;
  for (int i = 0; i < streams; ++i) {
    Duration pause(50);
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
      } catch (const tcp_handshake::Unresolvable& e) {
        // Its pod is not Ready yet (cluster DNS), or the name is wrong: say so once, then wait.
        last_error = e.what();
        if (!told_unresolved) {
          DTRAIN_LOG(kWarning) << e.what() << "; retrying until " << Seconds(deadline.timeout())
                               << " s have passed (DTRAIN_CONNECT_TIMEOUT_MS)";
          told_unresolved = true;
        }
      } catch (const Error& e) {
        last_error = e.what();  // not listening yet, or the network: try again
      }
      std::this_thread::sleep_for(std::min(pause, deadline.left()));
      // Backing off: a name that does not resolve may take minutes; a process that does not
      // listen yet usually starts within a second.
      pause = std::min(pause * 2, Duration(told_unresolved ? 1000 : 200));
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

void TcpTransport::ForgetPeer(NodeId peer) {
  std::vector<std::shared_ptr<Impl::OutStream>> old;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ++impl_->incarnation[peer];
    if (auto it = impl_->links.find(peer); it != impl_->links.end()) {
      old = std::move(it->second);
      impl_->links.erase(it);
    }
    impl_->lost.erase(peer);
    impl_->departed.erase(peer);
  }
  for (auto& stream : old) stream->Close();  // a closed stream reports nothing
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
      asio::post(stream->socket.get_executor(), [stream] { stream->Abort(); });
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

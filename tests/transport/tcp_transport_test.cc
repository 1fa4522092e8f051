// The TCP transport (tcp_transport.h) on real loopback sockets: the handshake with and without a
// job secret (who may connect, what a connection that fails it can do: nothing, and that a
// stream's sender is the id its handshake named), the receiver's body limit, and the socket
// options a node writes with. The raw clients below stand in for strangers.
#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "auth/job_auth.h"
#include "dtrain/common/error.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/wire.h"

namespace dtrain::transport {
namespace {

constexpr char kSecret[] = "0123456789abcdef-the-job-secret";

// An accepting node: records what reaches it.
struct Acceptor {
  explicit Acceptor(const std::string& secret, bool same_host = false)
      : transport(Options(secret, same_host)) {
    transport.SetHandlers(
        [this](Message&& msg) {
          std::lock_guard<std::mutex> lock(mutex);
          messages.push_back(std::move(msg));
          changed.notify_all();
        },
        [this](NodeId peer, const std::string&, const std::string& why) {
          std::lock_guard<std::mutex> lock(mutex);
          lost.push_back(std::to_string(peer) + ": " + why);
          changed.notify_all();
        });
    port = transport.Listen("127.0.0.1", 0);
  }

  static TcpOptions Options(const std::string& secret, bool same_host = false) {
    TcpOptions o;
    o.job_secret = secret;
    o.io_threads = 1;
    o.streams_per_peer = 1;
    o.same_host_direct = same_host;
    o.direct_min_bytes = 1024;
    o.hello_timeout = Duration(2000);
    return o;
  }

  // Waits (up to 10 s) until `n` messages arrived; true if they did.
  bool WaitForMessages(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(10), [&] { return messages.size() >= n; });
  }
  bool WaitForLoss() {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(10), [&] { return !lost.empty(); });
  }

  TcpTransport transport;
  uint16_t port = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Message> messages;
  std::vector<std::string> lost;
};

Message Heartbeat(NodeId sender) {
  Message m;
  m.header.command = Command::kHeartbeat;
  m.header.sender = sender;
  m.header.recipient = 1;
  m.meta = "hello there";
  return m;
}

// Connects as node `self` with `secret`; returns the error text, or "" if it connected.
std::string ConnectError(const Acceptor& a, const std::string& secret, NodeId self,
                         TcpTransport* keep = nullptr) {
  TcpTransport own(Acceptor::Options(secret));
  TcpTransport& t = keep != nullptr ? *keep : own;
  try {
    t.Connect(1, {"127.0.0.1", a.port}, self, Deadline(Duration(30000)));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A raw client: frames by hand, as a stranger (or a replaying eavesdropper) would send them.
struct RawClient {
  explicit RawClient(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{5, 0};  // no read blocks for ever
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawClient() { ::close(fd); }

  void Send(const Header& h, const std::string& meta) {
    WireHeader wire = EncodeHeader(h, meta.size(), 0);
    std::string bytes(wire.begin(), wire.end());
    bytes += meta;
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  void SendHello(NodeId sender, const std::string& meta) {
    Header h;
    h.command = Command::kHello;
    h.sender = sender;
    Send(h, meta);
  }

  // The next handshake frame's meta; "" at EOF or after 5 s.
  std::string ReadAnswer() {
    std::string header(kWireHeaderSize, '\0');
    if (!ReadExactly(header.data(), header.size())) return "";
    Frame f = DecodeHeader(header.data(), header.size(), Limits{});
    std::string meta(f.meta_len, '\0');
    if (!ReadExactly(meta.data(), meta.size())) return "";
    return meta;
  }

  // True if the other end closed the connection (within 5 s). Closing with our bytes unread makes
  // the kernel reset the connection rather than end it: that counts too.
  bool ClosedByPeer() {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

  bool ReadExactly(char* p, size_t n) {
    while (n > 0) {
      ssize_t k = ::recv(fd, p, n, 0);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  int fd = -1;
  bool connected = false;
};

TEST(TcpAuth, TheSameSecretConnectsAndTheMessageCarriesTheHellosId) {
  Acceptor a(kSecret);
  TcpTransport c(Acceptor::Options(kSecret));
  ASSERT_EQ(ConnectError(a, kSecret, 5, &c), "");
  c.Send(1, Heartbeat(5));
  ASSERT_TRUE(a.WaitForMessages(1));
  EXPECT_EQ(a.messages[0].header.sender, 5);
  EXPECT_EQ(a.messages[0].meta, "hello there");
  EXPECT_TRUE(a.lost.empty());
}

TEST(TcpAuth, WithoutASecretNothingChanges) {
  Acceptor a("");
  TcpTransport c(Acceptor::Options(""));
  ASSERT_EQ(ConnectError(a, "", 5, &c), "");
  c.Send(1, Heartbeat(5));
  ASSERT_TRUE(a.WaitForMessages(1));
}

// Each misconfiguration fails the connecting side at once (no retrying until the deadline: that
// would end in "could not connect ... within"), saying which side lacks or differs in the secret;
// the accepting side counts no member lost and receives nothing.
TEST(TcpAuth, AMissingOrWrongSecretIsRefusedAtOnceWithTheReason) {
  Acceptor a(kSecret);
  EXPECT_NE(ConnectError(a, "", 5).find("requires DTRAIN_JOB_SECRET, which is not set here"),
            std::string::npos);
  EXPECT_NE(ConnectError(a, "another-secret-of-16-chars", 5)
                .find("does not know this job's DTRAIN_JOB_SECRET"),
            std::string::npos);
  Acceptor open("");
  EXPECT_NE(ConnectError(open, kSecret, 5).find("set here but not there"), std::string::npos);
  a.transport.Shutdown(Deadline(Duration(5000)));  // joins the threads that deliver
  EXPECT_TRUE(a.messages.empty());
  EXPECT_TRUE(a.lost.empty()) << a.lost.front();
  open.transport.Shutdown(Deadline(Duration(5000)));
  EXPECT_TRUE(open.lost.empty()) << open.lost.front();
}

// A connector that knows the secret completes the handshake; an eavesdropper that replays its
// bytes meets a fresh challenge, so the recorded proof fails and it is refused.
TEST(TcpAuth, AReplayedHandshakeIsRefused) {
  Acceptor a(kSecret);
  const std::string nonce = auth::NewNonce();
  const std::string hello_meta = "nonce=" + nonce;
  std::string recorded_proof;
  {
    RawClient member(a.port);
    ASSERT_TRUE(member.connected);
    member.SendHello(7, hello_meta);
    const std::string challenge = member.ReadAnswer();
    ASSERT_EQ(challenge.rfind("dtrain-challenge 1 ", 0), 0u) << challenge;
    const std::string theirs = auth::WordValue(challenge, "nonce");
    EXPECT_EQ(auth::WordValue(challenge, "proof"),
              auth::Proof(kSecret, "dtrain-acceptor", {nonce, theirs}));
    recorded_proof = auth::Proof(kSecret, "dtrain-connector", {theirs, nonce, "7", hello_meta});
    member.SendHello(7, "proof=" + recorded_proof);
    EXPECT_EQ(member.ReadAnswer().rfind("dtrain-welcome 1 direct=", 0), 0u);
    Header bye;
    bye.command = Command::kBye;
    bye.sender = 7;
    member.Send(bye, "");
  }
  RawClient replay(a.port);
  replay.SendHello(7, hello_meta);
  const std::string challenge = replay.ReadAnswer();
  ASSERT_EQ(challenge.rfind("dtrain-challenge 1 ", 0), 0u) << challenge;
  replay.SendHello(7, "proof=" + recorded_proof);
  replay.Send(Heartbeat(7).header, "forged");
  EXPECT_EQ(replay.ReadAnswer(), "dtrain-welcome 1 refused=bad-proof");
  EXPECT_TRUE(replay.ClosedByPeer());
  a.transport.Shutdown(Deadline(Duration(5000)));  // joins the threads that deliver
  EXPECT_TRUE(a.messages.empty());
  EXPECT_TRUE(a.lost.empty()) << a.lost.front();
}

// Before the handshake completes nothing reaches the node, with or without a secret; the
// connection is closed as a stranger's, not reported as a member lost.
TEST(TcpAuth, AMessageBeforeTheHandshakeIsDropped) {
  for (const std::string& secret : {std::string(kSecret), std::string()}) {
    Acceptor a(secret);
    RawClient stranger(a.port);
    ASSERT_TRUE(stranger.connected);
    stranger.Send(Heartbeat(2).header, "no hello first");
    EXPECT_TRUE(stranger.ClosedByPeer());
    RawClient half(a.port);  // a hello with a nonce, then the data, never the proof
    if (!secret.empty()) {
      half.SendHello(2, "nonce=" + auth::NewNonce());
      EXPECT_EQ(half.ReadAnswer().rfind("dtrain-challenge", 0), 0u);
      half.Send(Heartbeat(2).header, "no proof");
      EXPECT_TRUE(half.ClosedByPeer());
    }
    a.transport.Shutdown(Deadline(Duration(5000)));  // joins the threads that deliver
    EXPECT_TRUE(a.messages.empty()) << "secret: " << !secret.empty();
    EXPECT_TRUE(a.lost.empty()) << a.lost.front();
  }
}

// A body longer than the receiver's limit for that message is never stored: the message arrives
// without it, flagged, with the reason, and the stream carries on. Inline and same-host bodies.
TEST(TcpBodyLimit, ABodyLongerThanTheLimitIsDroppedAndTheStreamGoesOn) {
  for (bool same_host : {false, true}) {
    Acceptor a(kSecret, same_host);
    a.transport.SetBodyLimit([](const Header& h) { return h.key == 1 ? size_t{16} : SIZE_MAX; });
    TcpTransport c(Acceptor::Options(kSecret, same_host));
    c.Connect(1, {"127.0.0.1", a.port}, 5, Deadline(Duration(10000)));
    for (auto [key, bytes] : {std::pair<uint64_t, size_t>{1, 1 << 20}, {2, 1 << 20}, {1, 16}}) {
      Message m = Heartbeat(5);
      m.header.command = Command::kPush;  // a message that may carry a body
      m.header.key = key;
      auto buffer = std::make_shared<std::vector<char>>(bytes, 'x');
      m.body.data = buffer->data();
      m.body.size = bytes;
      m.body.owner = buffer;
      c.Send(1, std::move(m));
    }
    ASSERT_TRUE(a.WaitForMessages(3)) << "same host " << same_host << ": " << a.messages.size()
                                      << " arrived; lost: " << (a.lost.empty() ? "" : a.lost[0]);
    const auto& got = a.messages;
    EXPECT_NE(got[0].header.flags & kFlagBodyRefused, 0u);
    EXPECT_EQ(got[0].body.size, 0u);
    EXPECT_EQ(got[0].meta, "its body of 1048576 bytes is more than the 16 expected here");
    EXPECT_EQ(got[1].header.flags & kFlagBodyRefused, 0u);
    EXPECT_EQ(got[1].body.size, size_t{1} << 20);
    EXPECT_EQ(got[1].body.data[12345], 'x');
    EXPECT_EQ(got[2].header.flags & kFlagBodyRefused, 0u);
    EXPECT_EQ(got[2].body.size, 16u);
    EXPECT_TRUE(a.lost.empty()) << a.lost.front();
  }
}

// The socket options a node writes with: DTRAIN_TCP_NOTSENT_LOWAT on every socket it dials, as the
// kernel reports it; DTRAIN_TCP_SNDBUF, fixed or auto, only on those to other hosts (tests/network
// covers those: here every connection stays on this host, so the kernel keeps sizing the buffer).
struct DialedSocketOptions {
  int send_buffer = -1;
  int notsent_lowat = -1;
  std::string congestion;
};

// Finds, among this process's open files, the TCP socket connected to 127.0.0.1:`port` from
// another port (the dialing end, not the accepted one) and reads its options.
DialedSocketOptions OptionsOfSocketDialedTo(uint16_t port) {
  DialedSocketOptions found;
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) return found;
  while (dirent* entry = ::readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    if (fd <= 2 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 ||
        peer.sin_family != AF_INET || ntohs(peer.sin_port) != port) {
      continue;
    }
    socklen_t size = sizeof found.send_buffer;
    ::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &found.send_buffer, &size);
    size = sizeof found.notsent_lowat;
    ::getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &found.notsent_lowat, &size);
    char name[16] = {};
    size = sizeof name;
    ::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &size);
    found.congestion = name;
    break;
  }
  ::closedir(fds);
  return found;
}

TEST(TcpOptions, TheLowWaterMarkIsOnTheSocketANodeDialsAndOnThisHostNoSendBufferCap) {
  Acceptor a(kSecret);
  TcpOptions capped = Acceptor::Options(kSecret);
  capped.send_buffer = 65536;
  capped.notsent_lowat = 16384;
  {
    TcpTransport dialer(capped);
    dialer.Connect(1, {"127.0.0.1", a.port}, 2, Deadline(Duration(30000)));
    const DialedSocketOptions got = OptionsOfSocketDialedTo(a.port);
    EXPECT_EQ(got.notsent_lowat, 16384);
    EXPECT_GT(got.send_buffer, 0);
    EXPECT_NE(got.send_buffer, 65536);  // loopback: tcp_wmem's default, or autotuned beyond it
  }
  TcpOptions defaults = Acceptor::Options(kSecret);
  defaults.notsent_lowat = 0;
  Acceptor b(kSecret);
  TcpTransport dialer(defaults);
  dialer.Connect(1, {"127.0.0.1", b.port}, 2, Deadline(Duration(30000)));
  const DialedSocketOptions got = OptionsOfSocketDialedTo(b.port);
  EXPECT_EQ(got.notsent_lowat, 0);  // unset: the sysctl applies
  // DTRAIN_TCP_SNDBUF=auto (the default) tunes only connections to other hosts, which start at
  // 32 KiB (send_buffer_tuner.h): this one keeps the kernel's sizing.
  EXPECT_EQ(defaults.send_buffer, Config::kAdaptiveSendBuffer);
  EXPECT_NE(got.send_buffer, 32768);
}

// Within this host the connections a node dials use the congestion control
// DTRAIN_TCP_LOCAL_CONGESTION names (cubic unless told), whatever the kernel's default; "system"
// (empty here) leaves that.
TEST(TcpOptions, ConnectionsWithinThisHostUseTheLocalCongestionControl) {
  const auto dialed_with = [](const std::string& congestion) {
    Acceptor a(kSecret);
    TcpOptions options = Acceptor::Options(kSecret);
    options.local_congestion = congestion;
    TcpTransport dialer(options);
    dialer.Connect(1, {"127.0.0.1", a.port}, 2, Deadline(Duration(30000)));
    return OptionsOfSocketDialedTo(a.port).congestion;
  };
  EXPECT_EQ(TcpOptions{}.local_congestion, "cubic");
  EXPECT_EQ(dialed_with("cubic"), "cubic");
  EXPECT_EQ(dialed_with("reno"), "reno");
  std::ifstream default_file("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string kernel_default;
  if (default_file >> kernel_default) {
    EXPECT_EQ(dialed_with(""), kernel_default);
  }
}

// Which connections DTRAIN_TCP_SNDBUF caps: those whose peer is neither loopback nor ourselves.
TEST(TcpOptions, OnlyConnectionsThatLeaveThisHostAreCapped) {
  using asio::ip::make_address;
  using asio::ip::tcp;
  const auto at = [](const char* address) { return tcp::endpoint(make_address(address), 9000); };
  EXPECT_TRUE(tcp_handshake::StaysOnThisHost(at("127.0.0.1"), at("127.0.0.1")));
  EXPECT_TRUE(tcp_handshake::StaysOnThisHost(at("127.0.0.1"), at("127.0.1.1")));
  EXPECT_TRUE(tcp_handshake::StaysOnThisHost(at("::1"), at("::1")));
  EXPECT_TRUE(tcp_handshake::StaysOnThisHost(at("10.253.1.2"), at("10.253.1.2")));
  EXPECT_FALSE(tcp_handshake::StaysOnThisHost(at("10.253.1.2"), at("10.253.1.3")));
  EXPECT_FALSE(tcp_handshake::StaysOnThisHost(at("fd00::1"), at("fd00::2")));
}

// A stream belongs to the id its handshake named: a message claiming another sender closes it, and
// that is the named member's failure (a member that forges is broken).
TEST(TcpAuth, AForgedSenderClosesTheStream) {
  Acceptor a(kSecret);
  TcpTransport c(Acceptor::Options(kSecret));
  ASSERT_EQ(ConnectError(a, kSecret, 5, &c), "");
  c.Send(1, Heartbeat(5));
  c.Send(1, Heartbeat(6));
  ASSERT_TRUE(a.WaitForLoss());
  EXPECT_NE(a.lost[0].find("5: it sent a message as node 6 on the connection of node 5"),
            std::string::npos)
      << a.lost[0];
  ASSERT_EQ(a.messages.size(), 1u);
  EXPECT_EQ(a.messages[0].header.sender, 5);
}

}  // namespace
}  // namespace dtrain::transport

namespace dtrain::transport {
namespace {

// A port of the ephemeral range that connect() may pick as a source port. Linux gives bind(0) odd
// ports and connect() even ones, so the neighbour of the kernel's pick for a bound socket; nobody
// listens there (if somebody did, Dial's first call would say so).
uint16_t EphemeralPortForConnect() {
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port() ^ 1;
}

// Connecting to a port of the ephemeral range where nobody listens can be given that very port as
// the source port, and TCP's simultaneous open connects the socket to itself. Dial must call that
// nobody listening (which callers retry), never hand it back as a connection.
TEST(TcpDial, AConnectionThatReachesItselfIsNobodyListening) {
  const uint16_t port = EphemeralPortForConnect();
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread runner([&io] { io.run(); });
  int reached_itself = 0;
  std::string unexpected;
  const auto until = Clock::now() + std::chrono::seconds(6);
  for (int i = 0; i < 60000 && Clock::now() < until && unexpected.empty(); ++i) {
    try {
      asio::ip::tcp::socket s =
          tcp_handshake::Dial(io, "127.0.0.1", port, Deadline(Duration(2000)));
      std::error_code ec;
      unexpected = "Dial returned a connection from " +
                   std::to_string(s.local_endpoint(ec).port()) + " to " + std::to_string(port);
    } catch (const tcp_handshake::NobodyListens& e) {
      reached_itself += std::string(e.what()).find("reached itself") != std::string::npos;
    } catch (const std::exception& e) {
      unexpected = e.what();
    }
  }
  guard.reset();
  io.stop();
  runner.join();
  EXPECT_TRUE(unexpected.empty()) << unexpected;
  RecordProperty("reached_itself", reached_itself);
}

// A pod's name resolves only once the pod is Ready (cluster DNS), often after its peers start:
// Connect keeps trying such a name until its deadline, then says what it last met.
TEST(TcpDial, ANameThatDoesNotResolveIsRetriedUntilTheDeadline) {
  TcpTransport t(TcpOptions{});
  try {
    t.Connect(1, {"no-such-host.invalid", 4000}, kNoNode, Deadline(Duration(1500)));
    ADD_FAILURE() << "connected";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot resolve 'no-such-host.invalid'"),
              std::string::npos)
        << e.what();
  }
  t.Shutdown(Deadline(Duration(1000)));
}

}  // namespace
}  // namespace dtrain::transport

// libFuzzer target for what a TCP connection can make a node do: the handshake (hello, challenge,
// proof) and the receive state machine after it (frames, bodies, identity), on a real TcpTransport
// listening on loopback with a job secret, as every node of a launched job does.
//
// The first byte of an input picks how far the harness goes before the fuzzer's bytes follow:
//   0: nothing: the bytes are the first thing the node reads (a stranger);
//   1: a hello with a nonce, then the fuzzer's bytes in place of the proof (a stranger that
//      guesses);
//   2: the whole handshake, done right with the secret, then the fuzzer's bytes (a member's
//      stream gone bad). Its hello asks for resending (PS_RESEND) as a new stream or, for every
//      other input, as one resuming, so the node counts and acknowledges what it delivers.
// The harness then closes its side and waits (bounded) for the node to close.
//
// Invariants, beyond no crash, no memory error and no undefined behaviour: in modes 0 and 1
// nothing may reach the node's message handler and no member may be reported lost (a stranger
// never counts); the node keeps accepting connections and closes each one whose peer closed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "auth/job_auth.h"
#include "common/logging.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/wire.h"

namespace {

using namespace dtrain::transport;

constexpr char kSecret[] = "fuzz-secret-0123456789abcdef";

std::atomic<int> g_delivered{0};
std::atomic<int> g_lost{0};
uint16_t g_port = 0;
// Each member stream claims a new id: the transport reports a given peer lost only once.
NodeId g_next_member = 100;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_tcp_receive: %s\n", what);
  std::abort();
}

TcpTransport& Node() {
  static TcpTransport* node = [] {
    dtrain::SetLogVerbosity(-2);  // errors only: strangers are dropped by the thousand here
    TcpOptions options;
    options.job_secret = kSecret;
    options.io_threads = 1;
    options.streams_per_peer = 1;
    options.hello_timeout = dtrain::Duration(300);
    options.resend_window = dtrain::Duration(10);  // a member that does not resume is lost soon
    options.max_message_bytes = size_t{1} << 20;   // the fuzzer may announce any length
    auto* t = new TcpTransport(options);           // lives for the whole run
    t->SetHandlers([](Message&&) { ++g_delivered; },
                   [](NodeId, const std::string&, const std::string&) { ++g_lost; });
    g_port = t->Listen("127.0.0.1", 0);
    return t;
  }();
  return *node;
}

using Clock = std::chrono::steady_clock;

long MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// poll() for one descriptor until `deadline`: 1 ready, 0 the deadline passed, -1 an error (errno).
// libFuzzer's -timeout alarm (SIGALRM) interrupts this thread's waits: an interrupted wait goes on.
int PollUntil(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const long left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return 0;
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready >= 0 || errno != EINTR) return ready;
  }
}

// An interrupted connect goes on in the background: the connection's outcome, 0 or an errno, once
// it is known (within 1 s).
int AwaitConnected(int fd) {
  const int ready = PollUntil(fd, POLLOUT, Clock::now() + std::chrono::seconds(1));
  if (ready <= 0) return ready == 0 ? ETIMEDOUT : errno;
  int error = 0;
  socklen_t length = sizeof error;
  return ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 ? error : errno;
}

// A fresh connection to the node. Tens of thousands of short connections leave as many in
// TIME_WAIT, and a new one now and then collides with one the node closed first: retry a few
// times before concluding the node stopped accepting.
int ConnectToNode() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(g_port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int error = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    error = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ? 0 : errno;
    if (error == EINTR) error = AwaitConnected(fd);
    if (error == 0) return fd;
    ::close(fd);
    ::usleep(50000);
  }
  std::fprintf(stderr, "fuzz_tcp_receive: connect: %s\n", std::strerror(error));
  Fail("the node stopped accepting connections (20 attempts over 1 s)");
}

bool SendAll(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

std::string HelloFrame(NodeId sender, const std::string& meta) {
  Header h;
  h.command = Command::kHello;
  h.sender = sender;
  WireHeader wire = EncodeHeader(h, meta.size(), 0);
  return std::string(wire.begin(), wire.end()) + meta;
}

// The node's next handshake frame: its meta, or why there is none. The deadline is generous: the
// invariant is that the node answers, not how fast, and a loaded two-core machine running ASan
// can stall any process for a moment.
struct Answer {
  std::string meta;
  std::string failure;  // "" when meta holds a frame's meta
};

Answer ReadAnswer(int fd) {
  const auto start = Clock::now();
  const auto waited = [&] { return std::to_string(MillisSince(start)) + " ms"; };
  std::string got;
  for (;;) {
    const int ready = PollUntil(fd, POLLIN, start + std::chrono::seconds(5));
    if (ready < 0) return {"", std::string("poll: ") + std::strerror(errno)};
    if (ready == 0) {
      return {"", "nothing within " + waited() + " (" + std::to_string(got.size()) + " bytes)"};
    }
    char buf[1024];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return {"", std::string("recv after ") + waited() + ": " + std::strerror(errno)};
    if (n == 0) return {"", "the node closed after " + waited()};
    got.append(buf, static_cast<size_t>(n));
    if (got.size() < kWireHeaderSize) continue;
    const Frame f = DecodeHeader(got.data(), kWireHeaderSize, Limits{});
    if (got.size() >= kWireHeaderSize + f.meta_len) {
      return {got.substr(kWireHeaderSize, f.meta_len), ""};
    }
  }
}

// Fails unless the answer's meta starts with `prefix`, saying what came instead.
std::string ExpectAnswer(int fd, const std::string& prefix, const char* what) {
  const Answer answer = ReadAnswer(fd);
  if (answer.meta.rfind(prefix, 0) == 0) return answer.meta;
  const std::string why =
      answer.failure.empty() ? "it answered \"" + answer.meta + "\"" : answer.failure;
  std::fprintf(stderr, "fuzz_tcp_receive: %s: %s\n", what, why.c_str());
  Fail(what);
}

// Closes our side and waits for the node to close its side: it must, at once for a member's stream
// or a stranger's garbage, within hello_timeout for a stranger that says too little. Within 5 s, or
// the node leaks the connection.
void Finish(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    const int ready = PollUntil(fd, POLLIN, deadline);
    if (ready == 0) Fail("the node kept a connection open 5 s after its peer closed");
    if (ready < 0) break;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // closed (or reset)
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Node();
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const std::string fuzz(reinterpret_cast<const char*>(data + 1), size - 1);
  const int delivered_before = g_delivered.load();
  const int lost_before = g_lost.load();
  const int fd = ConnectToNode();
  const NodeId self = g_next_member++;
  if (mode >= 1) {
    const std::string nonce = dtrain::auth::NewNonce();
    const bool resume = (data[0] / 3) % 2 == 1;
    const std::string hello_meta =
        (mode == 2 ? std::string(resume ? "stream=0 resume=1 " : "stream=0 ") : "") +
        "nonce=" + nonce;
    SendAll(fd, HelloFrame(self, hello_meta));
    const std::string challenge =
        ExpectAnswer(fd, "dtrain-challenge 1 ", "no challenge to a good hello");
    if (mode == 2) {
      const std::string theirs = dtrain::auth::WordValue(challenge, "nonce");
      const std::string proof = dtrain::auth::Proof(
          kSecret, "dtrain-connector", {theirs, nonce, std::to_string(self), hello_meta});
      SendAll(fd, HelloFrame(self, "proof=" + proof));
      ExpectAnswer(fd, "dtrain-welcome 1 direct=", "a good proof refused");
    }
  }
  SendAll(fd, fuzz);
  Finish(fd);
  if (mode < 2) {
    if (g_delivered.load() != delivered_before) Fail("a stranger's message reached the node");
    if (g_lost.load() != lost_before) Fail("a stranger counted as a member lost");
  } else {
    // The member's stream ended without a Bye (unless the fuzzer wrote one): its loss is reported
    // resend_window after the node closed; let it land before the next input takes its snapshot
    // (a loss landing during a stranger's input would fail it). Generous for a stalled machine;
    // only an input that says Bye waits it all.
    for (int i = 0; i < 200 && g_lost.load() == lost_before; ++i) ::usleep(10000);
  }
  return 0;
}

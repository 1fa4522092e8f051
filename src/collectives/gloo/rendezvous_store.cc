#include "collectives/gloo/rendezvous_store.h"

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "auth/handshake.h"
#include "collectives/byte_codec.h"
#include "collectives/error_text.h"
#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {

using asio::ip::tcp;

namespace {

enum Request : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kCheck = 4,
  kLost = 5,
  kGoodbye = 6,
  kProve = 7,
  kHeartbeat = 8,
};
enum Status : uint8_t { kOk = 0, kMissing = 1, kRefused = 2 };
constexpr size_t kMaxProofChars = 64;
// The labels of the store's challenge-response (auth/handshake.h): rank 0 accepts, ranks connect.
constexpr auth::HandshakeLabels kLabels{"dtrain-rendezvous-server", "dtrain-rendezvous-client"};

// Limits on what a peer may make us allocate or store. Gloo's entries are a few hundred bytes per
// rank; these leave ample room and still stop a stray client from exhausting rank 0's memory.
constexpr uint32_t kMaxBody = 16u << 20;
constexpr size_t kMaxKey = 4096;
constexpr uint32_t kMaxKeysPerCheck = 1u << 16;
constexpr size_t kMaxStoredBytes = size_t{256} << 20;
constexpr size_t kMissingKeysReported = 8;
// How long rank 0's server keeps answering, after a rank was lost, for the ranks still connected.
constexpr Duration kLingerAfterLoss(2000);
// How long a rank other than 0 waits, leaving, for rank 0's server to stop (~RendezvousClient).
constexpr Duration kAwaitServerStop(5000);
// How often rank 0's server looks for ranks gone silent.
constexpr Duration kLivenessCheckEvery(250);
constexpr size_t kMaxReasonChars = 512;

std::vector<char> Frame(ByteWriter& body) {
  ByteWriter frame;
  frame.U32(static_cast<uint32_t>(body.size()));
  frame.Raw(body.bytes().data(), body.size());
  return std::move(frame.bytes());
}

std::string PeerOf(const tcp::socket& socket) {
  std::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  return ec ? "(unknown)" : ep.address().to_string() + ":" + std::to_string(ep.port());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server: one io thread; the store and the lost list are touched only on it, so need no lock.

struct RendezvousServer::Impl {
  struct Connection;

  Impl(uint16_t port, int size, std::string job_secret, Duration hello_timeout,
       const std::string& host, Duration heartbeat_timeout)
      : size(size),
        job_secret(std::move(job_secret)),
        hello_timeout(hello_timeout),
        heartbeat_timeout(heartbeat_timeout) {
    std::error_code ec;
    // The announced address first (a local job then listens on loopback only); an address that is
    // not this machine's (a name behind NAT) falls back to every interface.
    if (const auto address = AddressOf(host)) {
      if (!Bind(tcp::endpoint(*address, port), ec)) {
        Start();
        return;
      }
      DTRAIN_LOG(kConnections) << "gloo rendezvous: cannot listen on " << host << ":" << port
                               << " (" << ec.message() << "); listening on every interface";
    }
    if (Bind(tcp::endpoint(tcp::v4(), port), ec)) {
      throw PeerError("rank 0 cannot host the gloo rendezvous on port " + std::to_string(port) +
                      " (DMLC_PS_ROOT_PORT): " + ec.message());
    }
    Start();
  }

  // Binds and listens; true on failure (ec says why), with the acceptor closed again.
  bool Bind(const tcp::endpoint& endpoint, std::error_code& ec) {
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) return false;
    std::error_code ignored;
    acceptor.close(ignored);
    return true;
  }

  // The IPv4 address `host` is or resolves to, if any.
  std::optional<asio::ip::address> AddressOf(const std::string& host) {
    if (host.empty()) return std::nullopt;
    std::error_code ec;
    tcp::resolver resolver(io);
    const auto results = resolver.resolve(tcp::v4(), host, "", ec);
    if (ec || results.empty()) return std::nullopt;
    return results.begin()->endpoint().address();
  }

  void Start() {
    Accept();
    if (heartbeat_timeout.count() > 0) CheckLiveness();
    thread = std::thread([this] { io.run(); });
  }

  // A rank whose process is frozen (SIGSTOP, a hung host) or cut off keeps its connection open but
  // stops sending: after heartbeat_timeout of silence it is lost, as if its connection had closed.
  void CheckLiveness();
  // Notes `rank` as lost for `why` (once); on the io thread.
  void Lose(int rank, const std::string& peer, const std::string& why);

  ~Impl();

  void Accept();
  std::vector<char> Serve(Connection& c, std::span<const char> body);

  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;
  const int size;
  const std::string job_secret;
  const Duration hello_timeout;
  const Duration heartbeat_timeout;  // 0: silence is never a loss
  asio::steady_timer liveness_timer{io};
  std::map<std::string, std::vector<char>> store;
  size_t stored_bytes = 0;
  std::vector<LostRank> lost;  // ranks that closed without a goodbye or went silent, in order
  std::set<std::shared_ptr<Connection>> connections;
  // Read by the destructor's thread: whether a rank was lost, and how many ranks are connected
  // and have not said goodbye.
  std::atomic<bool> any_lost{false};
  std::atomic<int> ranks_connected{0};
};

struct RendezvousServer::Impl::Connection : std::enable_shared_from_this<Connection> {
  Connection(Impl* server, tcp::socket s)
      : server(server), socket(std::move(s)), hello_timer(server->io) {
    peer = PeerOf(socket);
  }

  // A connection that has not become a rank within the hello timeout (a stranger that connects and
  // says nothing, or stops half-way through the proof) is dropped: it must not hold a descriptor
  // for the whole job.
  void StartHelloDeadline() {
    hello_timer.expires_after(server->hello_timeout);
    hello_timer.async_wait([self = shared_from_this()](std::error_code ec) {
      if (ec || self->rank >= 0 || !self->socket.is_open()) return;
      self->Drop("it did not say hello (and prove the job secret) within " +
                 std::to_string(self->server->hello_timeout.count()) + " ms");
    });
  }

  void ReadHeader() {
    asio::async_read(socket, asio::buffer(header),
                     [self = shared_from_this()](std::error_code ec, size_t) {
                       if (ec) return self->Closed();
                       uint32_t n = 0;
                       std::memcpy(&n, self->header, 4);
                       if (n == 0 || n > kMaxBody) {
                         return self->Drop("a frame of " + std::to_string(n) + " bytes");
                       }
                       self->body.resize(n);
                       self->ReadBody();
                     });
  }

  void ReadBody() {
    asio::async_read(socket, asio::buffer(body),
                     [self = shared_from_this()](std::error_code ec, size_t) {
                       if (ec) return self->Closed();
                       self->last_heard = Clock::now();
                       try {
                         self->reply = self->server->Serve(*self, self->body);
                       } catch (const ProtocolError& e) {
                         return self->Drop(e.what());
                       }
                       asio::async_write(self->socket, asio::buffer(self->reply),
                                         [self](std::error_code ec, size_t) {
                                           if (ec) return self->Closed();
                                           if (!self->refused.empty())
                                             return self->Drop(self->refused);
                                           self->ReadHeader();
                                         });
                     });
  }

  void Drop(const std::string& why) {
    DTRAIN_LOG(kWarning) << "gloo rendezvous: dropping the connection from " << peer << ": " << why;
    std::error_code ec;
    socket.close(ec);
    Closed();
  }

  void Admit(int as_rank) {
    rank = as_rank;
    ++server->ranks_connected;
  }

  void Closed() {
    hello_timer.cancel();  // else its handler keeps the io thread (and ~Impl) waiting
    if (closed) return;    // both the read and the write side may report the end
    closed = true;
    if (rank >= 0) RankLeft();
    server->connections.erase(shared_from_this());
  }

  void RankLeft() {
    if (goodbye) return;  // counted out at its goodbye
    server->Lose(rank, peer, "left the job (its connection closed)");
    --server->ranks_connected;
  }

  Impl* server;
  tcp::socket socket;
  asio::steady_timer hello_timer;
  std::string peer;
  int rank = -1;  // set once the hello (and, with a secret, the proof) checked out
  Clock::time_point last_heard = Clock::now();
  bool goodbye = false;
  bool closed = false;
  std::string refused;  // non-empty: the reply refuses the client, and the connection closes
  // With a secret, between the hello and the proof:
  int claimed_rank = -1;
  std::optional<auth::AcceptorHandshake> challenge;  // with a secret, from the hello on
  char header[4] = {};
  std::vector<char> body;
  std::vector<char> reply;
};

RendezvousServer::Impl::~Impl() {
  // After a rank was lost the others are failing too, and each asks who left: keep answering until
  // they have gone (within a bound), else they would find rank 0 gone and name it instead.
  const Deadline linger(kLingerAfterLoss);
  while (any_lost && ranks_connected > 0 && !linger.passed()) {
    std::this_thread::sleep_for(Duration(10));
  }
  asio::post(io, [this] {
    std::error_code ec;
    acceptor.close(ec);
    liveness_timer.cancel();
    for (auto& c : connections) c->socket.close(ec);
  });
  thread.join();
}

void RendezvousServer::Impl::CheckLiveness() {
  liveness_timer.expires_after(kLivenessCheckEvery);
  liveness_timer.async_wait([this](std::error_code ec) {
    if (ec || !acceptor.is_open()) return;
    const auto now = Clock::now();
    for (const auto& c : connections) {
      if (c->rank < 0 || c->goodbye || c->closed || now - c->last_heard <= heartbeat_timeout) {
        continue;
      }
      Lose(c->rank, c->peer,
           "sent nothing for " +
               SecondsText(std::chrono::duration_cast<Duration>(now - c->last_heard)) +
               " (PS_HEARTBEAT_TIMEOUT " + SecondsText(heartbeat_timeout) +
               "): its process is frozen or stopped, or its host is cut off");
    }
    CheckLiveness();
  });
}

void RendezvousServer::Impl::Lose(int rank, const std::string& peer, const std::string& why) {
  if (std::any_of(lost.begin(), lost.end(), [rank](const LostRank& l) { return l.rank == rank; })) {
    return;
  }
  DTRAIN_LOG(kWarning) << "gloo rendezvous: rank " << rank << " (" << peer << ") " << why;
  lost.push_back(LostRank{rank, why});
  any_lost = true;
}

void RendezvousServer::Impl::Accept() {
  acceptor.async_accept([this](std::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec != asio::error::operation_aborted && acceptor.is_open()) Accept();
      return;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto c = std::make_shared<Connection>(this, std::move(socket));
    connections.insert(c);
    c->StartHelloDeadline();
    c->ReadHeader();
    Accept();
  });
}

std::vector<char> RendezvousServer::Impl::Serve(Connection& c, std::span<const char> body) {
  ByteReader in(body, "rendezvous request from " + c.peer);
  ByteWriter out;
  const uint8_t type = in.U8("type");
  auto refuse = [&](const std::string& why) {
    c.refused = why;
    ByteWriter no;
    no.U8(kRefused);
    no.String(why);
    return Frame(no);
  };
  if (c.rank < 0 && type != kHello && type != kProve) {
    in.Fail("type", "request " + std::to_string(type) + " before the hello");
  }
  switch (type) {
    case kHello: {
      if (c.rank >= 0 || c.claimed_rank >= 0) in.Fail("type", "a second hello");
      const int32_t rank = in.I32("rank");
      if (rank < 0 || rank >= size) {
        in.Fail("rank", std::to_string(rank) + " is not a rank of a job of " +
                            std::to_string(size) + " (is DMLC_NUM_WORKER the same everywhere?)");
      }
      const bool offers_proof = !in.done();
      if (job_secret.empty()) {
        if (offers_proof) return refuse("DTRAIN_JOB_SECRET is set there but not on rank 0");
        c.Admit(rank);
        out.U8(kOk);
        break;
      }
      if (!offers_proof) return refuse("rank 0 requires DTRAIN_JOB_SECRET, which is not set there");
      const std::string nonce = in.String("nonce", kMaxProofChars);
      c.challenge.emplace(job_secret, kLabels);
      const std::optional<auth::Challenge> sent = c.challenge->OnHello(nonce);
      if (!sent) in.Fail("nonce", "not a nonce");
      c.claimed_rank = rank;
      out.U8(kOk);
      out.String(sent->nonce);
      out.String(sent->proof);
      break;
    }
    case kProve: {
      if (c.rank >= 0 || c.claimed_rank < 0) in.Fail("type", "a proof without a challenge");
      const std::string proof = in.String("proof", kMaxProofChars);
      in.ExpectEnd();
      if (!c.challenge->Verify(proof, {std::to_string(c.claimed_rank)})) {
        return refuse("its DTRAIN_JOB_SECRET differs from rank 0's");
      }
      c.Admit(c.claimed_rank);
      out.U8(kOk);
      break;
    }
    case kSet: {
      std::string key = in.String("key", kMaxKey);
      std::string value = in.String("value", kMaxBody);
      auto it = store.find(key);
      const size_t old_bytes = it == store.end() ? 0 : key.size() + it->second.size();
      if (stored_bytes - old_bytes + key.size() + value.size() > kMaxStoredBytes) {
        in.Fail("value", "the store would exceed " + std::to_string(kMaxStoredBytes) + " bytes");
      }
      stored_bytes = stored_bytes - old_bytes + key.size() + value.size();
      store[std::move(key)] = std::vector<char>(value.begin(), value.end());
      out.U8(kOk);
      break;
    }
    case kGet: {
      auto it = store.find(in.String("key", kMaxKey));
      if (it == store.end()) {
        out.U8(kMissing);
      } else {
        out.U8(kOk);
        out.String(std::string_view(it->second.data(), it->second.size()));
      }
      break;
    }
    case kCheck: {
      const uint32_t n = in.U32("key count");
      if (n > kMaxKeysPerCheck) in.Fail("key count", std::to_string(n) + " keys");
      std::vector<std::string> missing;
      uint32_t missing_count = 0;
      for (uint32_t i = 0; i < n; ++i) {
        std::string key = in.String("key", kMaxKey);
        if (store.count(key)) continue;
        ++missing_count;
        if (missing.size() < kMissingKeysReported) missing.push_back(std::move(key));
      }
      out.U8(kOk);
      out.U32(missing_count);
      out.U32(static_cast<uint32_t>(missing.size()));
      for (const auto& key : missing) out.String(key);
      break;
    }
    case kLost:
      out.U8(kOk);
      out.U32(static_cast<uint32_t>(lost.size()));
      for (const LostRank& l : lost) {
        out.I32(l.rank);
        out.String(l.why.substr(0, kMaxReasonChars));
      }
      break;
    case kHeartbeat:  // last_heard is all it is for
      out.U8(kOk);
      break;
    case kGoodbye:
      // A rank that leaves asks nothing more: rank 0's server need not linger for it (and it
      // waits for the server to stop, ~RendezvousClient).
      if (!c.goodbye && c.rank >= 0) --ranks_connected;
      c.goodbye = true;
      out.U8(kOk);
      break;
    default:
      in.Fail("type", "unknown request type " + std::to_string(type));
  }
  in.ExpectEnd();
  return Frame(out);
}

uint16_t RendezvousServer::port() const {
  std::error_code ec;
  const auto endpoint = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : endpoint.port();
}

RendezvousServer::RendezvousServer(uint16_t port, int size, std::string job_secret,
                                   Duration hello_timeout, const std::string& host,
                                   Duration heartbeat_timeout)
    : impl_(std::make_unique<Impl>(port, size, std::move(job_secret), hello_timeout, host,
                                   heartbeat_timeout)) {}
RendezvousServer::~RendezvousServer() = default;

// ---------------------------------------------------------------------------------------------
// Client: synchronous calls, each driven by running the io_context until it is done or its
// deadline passes (then the socket is closed, which ends the pending operation).

struct RendezvousClient::Impl {
  // Sends one request and returns the reply body. Throws TimeoutError / PeerError.
  std::vector<char> Exchange(ByteWriter& request, Duration timeout, const std::string& endpoint) {
    if (broken) {
      throw PeerError("the connection to the gloo rendezvous host (rank 0) at " + endpoint +
                      " is gone: " + broken_reason);
    }
    const std::vector<char> frame = Frame(request);
    std::error_code error;
    bool finished = false;
    char header[4] = {};
    std::vector<char> reply;
    auto finish = [&](std::error_code ec) {
      error = ec;
      finished = true;
    };
    asio::async_write(socket, asio::buffer(frame), [&](std::error_code ec, size_t) {
      if (ec) return finish(ec);
      asio::async_read(socket, asio::buffer(header), [&](std::error_code ec, size_t) {
        if (ec) return finish(ec);
        uint32_t n = 0;
        std::memcpy(&n, header, 4);
        if (n == 0 || n > kMaxBody) return finish(asio::error::message_size);
        reply.resize(n);
        asio::async_read(socket, asio::buffer(reply),
                         [&](std::error_code ec, size_t) { finish(ec); });
      });
    });
    io.restart();
    io.run_for(timeout);
    if (!finished) {
      std::error_code ignored;
      socket.close(ignored);
      io.restart();
      io.run();  // lets the cancelled handlers run before their captures go out of scope
      Break("no answer within " + SecondsText(timeout));
      throw TimeoutError("the gloo rendezvous host (rank 0) at " + endpoint +
                         " did not answer within " + SecondsText(timeout));
    }
    if (error) {
      Break(error.message());
      throw PeerError("lost the connection to the gloo rendezvous host (rank 0) at " + endpoint +
                      ": " + error.message());
    }
    return reply;
  }

  void Break(const std::string& why) {
    broken = true;
    broken_reason = why;
  }

  // Waits (at most `timeout`) for the server to close the connection.
  void AwaitClose(Duration timeout) {
    char byte = 0;
    asio::async_read(socket, asio::buffer(&byte, 1), [](std::error_code, size_t) {});
    io.restart();
    io.run_for(timeout);
    std::error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();  // lets the cancelled read's handler run
  }

  asio::io_context io;
  tcp::socket socket{io};
  bool broken = false;
  std::string broken_reason;
};

RendezvousClient::RendezvousClient(const std::string& host, uint16_t port, int rank,
                                   Duration connect_timeout, const std::string& job_secret,
                                   Duration heartbeat_interval)
    : impl_(std::make_unique<Impl>()),
      endpoint_(host + ":" + std::to_string(port)),
      request_timeout_(connect_timeout),
      rank_(rank) {
  const Deadline deadline(connect_timeout);
  std::string last_error = "no attempt made";
  Duration pause(20);
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    tcp::resolver resolver(impl_->io);
    auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (!ec) {
      bool finished = false;
      asio::async_connect(impl_->socket, endpoints, [&](std::error_code e, const tcp::endpoint&) {
        ec = e;
        finished = true;
      });
      impl_->io.restart();
      impl_->io.run_for(std::max(deadline.left(), Duration(1)));
      if (!finished) {
        std::error_code ignored;
        impl_->socket.close(ignored);
        impl_->io.restart();
        impl_->io.run();
        ec = asio::error::timed_out;
      }
    }
    if (!ec) break;
    last_error = ec.message();
    std::error_code ignored;
    impl_->socket.close(ignored);
    if (deadline.passed()) {
      throw TimeoutError("rank " + std::to_string(rank) +
                         " could not reach the gloo rendezvous host (rank 0) at " + endpoint_ +
                         " within " + SecondsText(connect_timeout) + " (" +
                         std::to_string(attempt + 1) + " attempts; last: " + last_error +
                         "); is rank 0 running, and DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT right?");
    }
    std::this_thread::sleep_for(std::min(pause, deadline.left()));
    pause = std::min(pause * 2, Duration(500));
  }
  std::error_code ignored;
  impl_->socket.set_option(tcp::no_delay(true), ignored);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Hello(rank, job_secret);
  }
  if (heartbeat_interval.count() > 0) {
    heartbeat_ = std::thread([this, heartbeat_interval] { SendHeartbeats(heartbeat_interval); });
  }
}

void RendezvousClient::SendHeartbeats(Duration interval) {
  std::unique_lock<std::mutex> wait_lock(heartbeat_mutex_);
  while (!heartbeat_stop_.wait_for(wait_lock, interval, [this] { return stopping_; })) {
    ByteWriter heartbeat;
    heartbeat.U8(kHeartbeat);
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      // Bounded well below the request timeout: a frozen rank 0 must not hold the connection (and
      // the watchdog's question who is lost) for long.
      impl_->Exchange(heartbeat, std::min(request_timeout_, interval * 10), endpoint_);
    } catch (const Error&) {
      return;  // the connection is gone: the next request says so, naming rank 0
    }
  }
}

void RendezvousClient::Hello(int rank, const std::string& job_secret) {
  const std::string what = "reply from the gloo rendezvous host " + endpoint_;
  auto check_refusal = [&](ByteReader& in) {
    if (in.U8("status") == kOk) return;
    const std::string why = in.String("reason", kMaxKey);
    throw PeerError("the gloo rendezvous host (rank 0) at " + endpoint_ + " refused rank " +
                    std::to_string(rank) + ": " + why);
  };
  ByteWriter hello;
  hello.U8(kHello);
  hello.I32(rank);
  std::optional<auth::ConnectorHandshake> handshake;
  if (!job_secret.empty()) {
    handshake.emplace(job_secret, kLabels);
    hello.String(handshake->nonce());
  }
  const std::vector<char> reply = impl_->Exchange(hello, request_timeout_, endpoint_);
  ByteReader in(reply, what);
  check_refusal(in);
  if (job_secret.empty()) return;
  if (in.done()) {
    throw PeerError("the gloo rendezvous host (rank 0) at " + endpoint_ +
                    " did not answer our authentication: DTRAIN_JOB_SECRET is not set there");
  }
  const std::string server_nonce = in.String("nonce", kMaxProofChars);
  const std::string proof = in.String("proof", kMaxProofChars);
  const std::optional<std::string> our_proof =
      handshake->Answer(server_nonce, proof, {std::to_string(rank)});
  if (!our_proof) {
    throw PeerError("the gloo rendezvous host at " + endpoint_ +
                    " does not know this job's DTRAIN_JOB_SECRET (another job, or a stranger, "
                    "listens there)");
  }
  ByteWriter prove;
  prove.U8(kProve);
  prove.String(*our_proof);
  const std::vector<char> answer = impl_->Exchange(prove, request_timeout_, endpoint_);
  ByteReader verdict(answer, what);
  check_refusal(verdict);
}

RendezvousClient::~RendezvousClient() {
  if (heartbeat_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(heartbeat_mutex_);
      stopping_ = true;
    }
    heartbeat_stop_.notify_all();
    heartbeat_.join();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    ByteWriter goodbye;
    goodbye.U8(kGoodbye);
    impl_->Exchange(goodbye, Duration(2000), endpoint_);
    // Rank 0's server closes every connection as it stops. Until it has, a rendezvous on the same
    // port (init again after shutdown) could reach it instead of its successor and lose the
    // connection halfway; so the other ranks leave only once it is gone. Rank 0's own client
    // goes before its server: it does not wait.
    if (rank_ != 0) impl_->AwaitClose(kAwaitServerStop);
  } catch (const Error&) {
    // Rank 0 has gone already; nothing to tell it.
  }
}

void RendezvousClient::set(const std::string& key, const std::vector<char>& data) {
  ByteWriter request;
  request.U8(kSet);
  request.String(key);
  request.String(std::string_view(data.data(), data.size()));
  std::lock_guard<std::mutex> lock(mutex_);
  auto reply = impl_->Exchange(request, request_timeout_, endpoint_);
  ByteReader in(reply, "reply from the gloo rendezvous host " + endpoint_);
  if (in.U8("status") != kOk) in.Fail("status", "set refused");
}

std::vector<char> RendezvousClient::get(const std::string& key) {
  // Gloo expects get to wait for the key, as its own stores do.
  wait({key}, request_timeout_);
  ByteWriter request;
  request.U8(kGet);
  request.String(key);
  std::lock_guard<std::mutex> lock(mutex_);
  auto reply = impl_->Exchange(request, request_timeout_, endpoint_);
  ByteReader in(reply, "reply from the gloo rendezvous host " + endpoint_);
  if (in.U8("status") != kOk) {
    throw PeerError("gloo rendezvous: key '" + key + "' is not in the store at " + endpoint_);
  }
  std::string value = in.String("value", kMaxBody);
  in.ExpectEnd();
  return {value.begin(), value.end()};
}

void RendezvousClient::wait(const std::vector<std::string>& keys) { wait(keys, request_timeout_); }

void RendezvousClient::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  ByteWriter request;
  request.U8(kCheck);
  request.U32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) request.String(key);
  const Deadline deadline(timeout);
  Duration pause(1);
  while (true) {
    std::vector<char> reply;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reply = impl_->Exchange(request, request_timeout_, endpoint_);
    }
    ByteReader in(reply, "reply from the gloo rendezvous host " + endpoint_);
    in.U8("status");
    const uint32_t missing = in.U32("missing count");
    if (missing == 0) return;
    if (deadline.passed()) {
      const uint32_t listed = std::min<uint32_t>(in.U32("listed count"), kMissingKeysReported);
      std::string names;
      for (uint32_t i = 0; i < listed; ++i) names += (i ? ", " : "") + in.String("key", kMaxKey);
      throw TimeoutError("gloo rendezvous at " + endpoint_ + ": after " + SecondsText(timeout) +
                         " still waiting for " + std::to_string(missing) + " key(s) (" + names +
                         "): has every rank started with the same DMLC_NUM_WORKER?");
    }
    std::this_thread::sleep_for(std::min(pause, deadline.left()));
    pause = std::min(pause * 2, Duration(50));
  }
}

std::vector<LostRank> RendezvousClient::LostRanks(Duration timeout) {
  ByteWriter request;
  request.U8(kLost);
  std::vector<char> reply;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reply = impl_->Exchange(request, timeout, endpoint_);
  }
  ByteReader in(reply, "reply from the gloo rendezvous host " + endpoint_);
  in.U8("status");
  const uint32_t n = in.U32("lost count");
  if (n > in.left() / 8) in.Fail("lost count", std::to_string(n) + " ranks");
  std::vector<LostRank> lost(n);
  for (auto& l : lost) {
    l.rank = in.I32("rank");
    l.why = in.String("reason", kMaxReasonChars);
  }
  in.ExpectEnd();
  return lost;
}

}  // namespace dtrain::collectives

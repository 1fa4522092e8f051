#include "collectives/gloo/rendezvous_server.h"

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <thread>

#include "auth/handshake.h"
#include "collectives/byte_codec.h"
#include "collectives/error_text.h"
#include "collectives/gloo/rendezvous_client.h"
#include "collectives/gloo/rendezvous_wire.h"
#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {

using asio::ip::tcp;

namespace {

using namespace rendezvous_wire;

// Limits on what a client may make rank 0 store, beyond the protocol's (rendezvous_wire.h).
constexpr uint32_t kMaxKeysPerCheck = 1u << 16;
constexpr size_t kMaxStoredBytes = size_t{256} << 20;
// How long rank 0's server keeps answering, after a rank was lost, for the ranks still connected.
constexpr Duration kLingerAfterLoss(2000);
// How often rank 0's server looks for ranks gone silent.
constexpr Duration kLivenessCheckEvery(250);

std::string PeerOf(const tcp::socket& socket) {
  std::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  return ec ? "(unknown)" : ep.address().to_string() + ":" + std::to_string(ep.port());
}

}  // namespace

// One io thread; the store and the lost list are touched only on it, so need no lock.

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
  // Set on the io thread as the server stops: the connections it closes then are not losses.
  bool stopping = false;
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
    // Counted out at its goodbye; or the server closed it as it stopped, which it does at the
    // job's end once every rank has shut its collectives down, often before a slower rank's
    // goodbye has arrived: not a rank that left.
    if (goodbye || server->stopping) return;
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
    stopping = true;
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

}  // namespace dtrain::collectives

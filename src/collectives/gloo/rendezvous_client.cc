#include "collectives/gloo/rendezvous_client.h"

#include <algorithm>
#include <asio.hpp>
#include <cstring>
#include <optional>
#include <thread>

#include "auth/handshake.h"
#include "collectives/byte_codec.h"
#include "collectives/error_text.h"
#include "collectives/gloo/rendezvous_wire.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {

using asio::ip::tcp;

namespace {

using namespace rendezvous_wire;

// How long a rank other than 0 waits, leaving, for rank 0's server to stop (~RendezvousClient).
constexpr Duration kAwaitServerStop(5000);

}  // namespace

// Synchronous calls, each driven by running the io_context until it is done or its deadline passes
// (then the socket is closed, which ends the pending operation).

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

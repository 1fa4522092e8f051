#include "launcher/status/report_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/streambuf.hpp>
#include <asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <set>

#include "dtrain/common/error.h"

namespace dtrain::launcher {
namespace {

constexpr size_t kMaxLineBytes = size_t{64} << 20;  // a batch of timeline events fits
// Until a connection has said hello, it may not make the launcher hold more than this.
constexpr size_t kMaxHelloBytes = 4096;
constexpr std::chrono::seconds kHelloDeadline(5);
constexpr int kMaxRefusalsSaid = 5;

std::string RandomToken() {
  std::random_device device;  // the system's random source
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 32; ++i) token += hex[device() % 16];
  return token;
}

bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ReportChannel ReportChannel::Open(bool loopback_only) {
  ReportChannel c;
  c.listener.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (c.listener.get() < 0) throw Error(std::string("report socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
  addr.sin_port = 0;
  if (::bind(c.listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(c.listener.get(), 128) != 0) {
    throw Error(std::string("cannot listen for the job's reports: ") + std::strerror(errno));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(c.listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  c.port = ntohs(addr.sin_port);
  c.token = RandomToken();
  return c;
}

void TellProcesses(JobPlan* plan, const std::string& address, const ReportChannel& channel) {
  for (ProcessSpec& p : plan->processes) {
    p.env.insert(p.env.begin(),
                 {{"DTRAIN_REPORT_ADDR", address + ":" + std::to_string(channel.port)},
                  {"DTRAIN_REPORT_TOKEN", channel.token}});
  }
}

struct ReportServer::Impl : std::enable_shared_from_this<ReportServer::Impl> {
  Impl(asio::io_context& io, ReportChannel channel, RecordFn on_record, TextFn on_text, SayFn say)
      : io(io),
        acceptor(io),
        token(channel.token),
        on_record(std::move(on_record)),
        on_text(std::move(on_text)),
        say(std::move(say)) {
    acceptor.assign(asio::ip::tcp::v4(), channel.listener.release());
  }

  struct Connection : std::enable_shared_from_this<Connection> {
    Connection(asio::ip::tcp::socket s, std::shared_ptr<Impl> owner)
        : socket(std::move(s)),
          hello_buffer(kMaxHelloBytes),
          buffer(kMaxLineBytes),
          hello_timer(owner->io),
          owner(owner) {}

    asio::ip::tcp::socket socket;
    asio::streambuf hello_buffer;  // a stranger's bytes: small
    asio::streambuf buffer;        // a member's
    asio::steady_timer hello_timer;
    std::weak_ptr<Impl> owner;
    std::optional<NodeKey> node;     // after a good hello
    std::string peer;                // "address:port", for messages
    std::string peer_address;        // the address alone
    std::deque<std::string> outbox;  // lines to write, the first one being written

    void Start() {
      asio::error_code ec;
      auto endpoint = socket.remote_endpoint(ec);
      peer_address = ec ? "" : endpoint.address().to_string();
      peer = ec ? "?" : peer_address + ":" + std::to_string(endpoint.port());
      hello_timer.expires_after(kHelloDeadline);
      hello_timer.async_wait([self = shared_from_this()](const asio::error_code& e) {
        if (!e && !self->node) self->Refuse("no hello within 5 s");
      });
      Read();
    }

    void Read() {
      asio::streambuf& in = node ? buffer : hello_buffer;
      asio::async_read_until(
          socket, in, '\n', [self = shared_from_this(), &in](const asio::error_code& ec, size_t n) {
            if (ec) {
              if (!self->node && ec != asio::error::operation_aborted) {
                self->Refuse(ec == asio::error::not_found ? "a line too long"
                                                          : "it closed before saying hello");
              }
              self->Close();
              return;
            }
            std::string line(asio::buffers_begin(in.data()), asio::buffers_begin(in.data()) + n);
            in.consume(n);
            const bool was_member = self->node.has_value();
            if (!self->Take(line)) return;
            if (!was_member && self->node) {
              // A member now: what came after its hello moves to the member's buffer.
              const size_t rest = self->hello_buffer.size();
              self->buffer.commit(
                  asio::buffer_copy(self->buffer.prepare(rest), self->hello_buffer.data()));
              self->hello_buffer.consume(rest);
            }
            self->Read();
          });
    }

    // One line; false when the connection is done.
    bool Take(const std::string& line) {
      auto impl = owner.lock();
      if (!impl) return false;
      if (node && line.size() >= 3 && line.front() == '[' && line[line.size() - 2] == ']') {
        impl->on_text(*node, std::string_view(line).substr(0, line.size() - 1));
        return true;
      }
      auto record = nlohmann::json::parse(line, nullptr, false);
      if (!record.is_object()) {
        Refuse("a line that is not a JSON object");
        return false;
      }
      if (!node) {
        auto key = ParseNodeKey(record);
        auto token = record.find("token");
        if (record.value("kind", "") != "hello" || token == record.end() || !token->is_string() ||
            !SameToken(token->get<std::string>(), impl->token) || !key) {
          Refuse("a hello without the job's token");
          return false;
        }
        node = key;
        hello_timer.cancel();
        Write(nlohmann::json{{"now_us", NowMicros()}}.dump() + "\n");
        impl->on_record(*node, record);
        return true;
      }
      const auto kind = record.find("kind");
      if (kind != record.end() && kind->is_string() &&
          kind->get<std::string>().rfind("elastic_", 0) == 0) {
        if (impl->on_request) {
          std::weak_ptr<Connection> weak = shared_from_this();
          impl->on_request(*node, peer_address, record, [weak](const nlohmann::json& answer) {
            if (auto self = weak.lock()) self->Write(answer.dump() + "\n");
          });
        }
        return true;
      }
      impl->on_record(*node, record);
      return true;
    }

    // Queues a line; one write at a time, in order.
    void Write(std::string line) {
      if (!socket.is_open()) return;
      outbox.push_back(std::move(line));
      if (outbox.size() == 1) WriteFirst();
    }

    void WriteFirst() {
      asio::async_write(socket, asio::buffer(outbox.front()),
                        [self = shared_from_this()](const asio::error_code& ec, size_t) {
                          if (ec) return;
                          self->outbox.pop_front();
                          if (!self->outbox.empty()) self->WriteFirst();
                        });
    }

    void Refuse(const std::string& why) {
      if (auto impl = owner.lock()) impl->Refused(peer, why);
      Close();
    }

    void Close() {
      asio::error_code ignored;
      hello_timer.cancel();
      socket.close(ignored);
      // The callback that called this holds a reference: erasing does not destroy it yet.
      if (auto impl = owner.lock()) impl->connections.erase(shared_from_this());
    }
  };

  void Accept() {
    acceptor.async_accept(
        [self = shared_from_this()](const asio::error_code& ec, asio::ip::tcp::socket socket) {
          if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
          if (!ec) {
            auto c = std::make_shared<Connection>(std::move(socket), self);
            self->connections.insert(c);
            c->Start();
          }
          self->Accept();
        });
  }

  void Refused(const std::string& peer, const std::string& why) {
    if (++refusals <= kMaxRefusalsSaid) {
      say("ignoring a connection to the report port from " + peer + ": " + why +
          (refusals == kMaxRefusalsSaid ? " (further ones are not reported)" : ""));
    }
  }

  void Stop() {
    asio::error_code ignored;
    acceptor.close(ignored);
    auto open = connections;  // Close erases from the set
    for (auto& c : open) c->Close();
    connections.clear();
  }

  asio::io_context& io;
  asio::ip::tcp::acceptor acceptor;
  const std::string token;
  RecordFn on_record;
  TextFn on_text;
  SayFn say;
  RequestFn on_request;
  std::set<std::shared_ptr<Connection>> connections;
  int refusals = 0;
};

ReportServer::ReportServer(asio::io_context& io, ReportChannel channel, RecordFn on_record,
                           TextFn on_text, SayFn say)
    : impl_(std::make_shared<Impl>(io, std::move(channel), std::move(on_record), std::move(on_text),
                                   std::move(say))) {
  impl_->Accept();
}

ReportServer::~ReportServer() { Stop(); }

void ReportServer::Stop() { impl_->Stop(); }

void ReportServer::set_on_request(RequestFn fn) { impl_->on_request = std::move(fn); }

}  // namespace dtrain::launcher

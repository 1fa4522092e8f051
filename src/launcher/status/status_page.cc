#include "launcher/status/status_page.h"

#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/streambuf.hpp>
#include <asio/write.hpp>
#include <chrono>

#include "dtrain/common/error.h"

namespace dtrain::launcher {
namespace {

constexpr size_t kMaxRequestBytes = 16 * 1024;
constexpr std::chrono::seconds kRequestDeadline(5);

std::string Response(const std::string& status, const std::string& type, const std::string& body) {
  return "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
         "\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

const std::string& StatusHtml() {
  static const std::string html = R"HTML(<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>dtrain job</title>
<style>
body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; margin-bottom: 1em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; }
th { background: #eee; }
.failed { background: #fdd; } .finished { color: #666; } .straggler { background: #ffe9b3; }
#failure { color: #b00; font-weight: bold; }
</style></head>
<body>
<h1>dtrain job</h1>
<p id="summary">waiting for the launcher...</p>
<p id="failure"></p>
<table id="nodes"><thead><tr><th>node</th><th>host</th><th>pid</th><th>state</th>
<th>last heard</th><th>steps/s</th><th>samples/s</th><th>waiting</th><th>traffic in / out</th>
<th>restarts, checkpoints</th><th>exit</th></tr></thead><tbody></tbody></table>
<h2>Errors</h2><ul id="errors"></ul>
<h2>Memberships (elastic)</h2><ul id="resets"></ul>
<script>
function cell(row, text) { const td = document.createElement('td'); td.textContent = text; row.appendChild(td); }
function mb(b) { return (b / 1048576).toFixed(1) + ' MB'; }
// What restarts cost a node: its checkpoints (servers) or its copies into the push log (workers,
// once they leave), next to the restarts themselves.
function restartsAndCheckpoints(n) {
  const parts = (n.restarts || []).map(r => 'restarted ' + r);
  if (n.checkpoints) {
    parts.push(n.checkpoints + ' checkpoint(s), the last ' + mb(n.checkpoint_bytes) + ' in ' +
               n.checkpoint_ms.toFixed(1) + ' ms, ' + n.checkpoint_cpu_ms.toFixed(1) + ' ms of CPU in all');
  }
  if (n.push_log_bytes) {
    parts.push('push log: ' + mb(n.push_log_bytes) + ' copied into it in ' +
               n.push_log_copy_ms.toFixed(1) + ' ms' + (n.push_log_reserved_bytes ?
               ', ' + mb(n.push_log_reserved_bytes) + ' faulted in at the start in ' +
               n.push_log_reserve_ms.toFixed(1) + ' ms' : ''));
  }
  return parts.join('; ');
}
async function refresh() {
  try {
    const s = await (await fetch('/api/status', {cache: 'no-store'})).json();
    document.getElementById('summary').textContent =
      'running for ' + s.elapsed_s.toFixed(0) + ' s; ' + s.samples_per_s.toFixed(1) +
      ' samples/s in all' + (s.straggler ? '; straggler: ' + s.straggler : '');
    document.getElementById('failure').textContent = s.failure ?
      'failed: ' + s.failure.node + ': ' + s.failure.cause + ' (reported by ' + s.failure.reported_by + ')' : '';
    const body = document.querySelector('#nodes tbody');
    body.innerHTML = '';
    for (const n of s.nodes) {
      const row = document.createElement('tr');
      row.className = n.straggler ? 'straggler' : n.state;
      cell(row, n.name + (n.straggler ? ' (straggler)' : ''));
      cell(row, n.host); cell(row, n.pid || '');
      cell(row, n.state);
      cell(row, n.last_heard_s_ago === null ? 'never' : n.last_heard_s_ago.toFixed(1) + ' s ago');
      cell(row, n.steps_per_s !== undefined ? n.steps_per_s.toFixed(1) : '');
      cell(row, n.samples_per_s !== undefined ? n.samples_per_s.toFixed(1) : '');
      cell(row, n.wait_s !== undefined ? n.wait_s.toFixed(1) + ' s' : '');
      cell(row, n.bytes_in !== undefined ? mb(n.bytes_in) + ' / ' + mb(n.bytes_out) : '');
      cell(row, restartsAndCheckpoints(n));
      cell(row, n.exit);
      body.appendChild(row);
    }
    const errors = document.getElementById('errors');
    errors.innerHTML = '';
    for (const e of s.errors) { const li = document.createElement('li'); li.textContent = e; errors.appendChild(li); }
    const resets = document.getElementById('resets');
    resets.innerHTML = '';
    for (const e of s.resets || []) { const li = document.createElement('li'); li.textContent = e; resets.appendChild(li); }
  } catch (e) {
    document.getElementById('summary').textContent = 'the launcher does not answer: the job has ended';
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body></html>
)HTML";
  return html;
}

struct StatusPage::Impl : std::enable_shared_from_this<StatusPage::Impl> {
  Impl(asio::io_context& io, const std::string& host, uint16_t port,
       std::function<nlohmann::json()> status)
      : io(io), acceptor(io), status(std::move(status)) {
    asio::error_code ec;
    const auto address = asio::ip::make_address(host, ec);
    if (ec) throw Error("--status-host " + host + " is not an IP address");
    const asio::ip::tcp::endpoint endpoint(address, port);
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      throw Error("cannot serve the status page on " + host + ":" + std::to_string(port) + ": " +
                  ec.message());
    }
  }

  struct Request : std::enable_shared_from_this<Request> {
    Request(asio::ip::tcp::socket s, std::shared_ptr<Impl> owner)
        : socket(std::move(s)), buffer(kMaxRequestBytes), timer(owner->io), owner(owner) {}

    asio::ip::tcp::socket socket;
    asio::streambuf buffer;
    asio::steady_timer timer;
    std::weak_ptr<Impl> owner;
    std::string response;

    void Start() {
      timer.expires_after(kRequestDeadline);
      timer.async_wait([self = shared_from_this()](const asio::error_code& ec) {
        if (!ec) self->Close();
      });
      asio::async_read_until(socket, buffer, "\r\n\r\n",
                             [self = shared_from_this()](const asio::error_code& ec, size_t) {
                               if (ec) return self->Close();
                               self->Answer();
                             });
    }

    void Answer() {
      std::istream in(&buffer);
      std::string method, target, version;
      in >> method >> target >> version;
      auto impl = owner.lock();
      if (!impl) return Close();
      if (method != "GET") {
        response = Response("405 Method Not Allowed", "text/plain", "only GET\n");
      } else if (target == "/" || target == "/index.html") {
        response = Response("200 OK", "text/html; charset=utf-8", StatusHtml());
      } else if (target == "/api/status") {
        response = Response("200 OK", "application/json", impl->status().dump(2) + "\n");
      } else {
        response = Response("404 Not Found", "text/plain", "not found: / and /api/status\n");
      }
      asio::async_write(
          socket, asio::buffer(response),
          [self = shared_from_this()](const asio::error_code&, size_t) { self->Close(); });
    }

    void Close() {
      asio::error_code ignored;
      timer.cancel();
      socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
    }
  };

  void Accept() {
    acceptor.async_accept(
        [self = shared_from_this()](const asio::error_code& ec, asio::ip::tcp::socket socket) {
          if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
          if (!ec) std::make_shared<Request>(std::move(socket), self)->Start();
          self->Accept();
        });
  }

  asio::io_context& io;
  asio::ip::tcp::acceptor acceptor;
  std::function<nlohmann::json()> status;
};

StatusPage::StatusPage(asio::io_context& io, const std::string& host, uint16_t port,
                       std::function<nlohmann::json()> status)
    : impl_(std::make_shared<Impl>(io, host, port, std::move(status))) {
  impl_->Accept();
}

StatusPage::~StatusPage() { Stop(); }

uint16_t StatusPage::port() const {
  asio::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void StatusPage::Stop() {
  asio::error_code ignored;
  impl_->acceptor.close(ignored);
}

}  // namespace dtrain::launcher

// InStream's framing: header, meta and body of each message, handed over in order (see
// in_stream.h for the other two parts).
#include "transport/tcp/in_stream.h"

#include <cerrno>
#include <cstring>

#include "common/buffer_pool.h"
#include "common/logging.h"
#include "transport/tcp/out_stream.h"
#include "transport/tcp/tcp_handshake.h"

namespace dtrain::transport {

namespace {
constexpr size_t kStagingBytes = 64 * 1024;
}  // namespace

TcpTransport::Impl::InStream::InStream(Impl* impl, asio::ip::tcp::socket socket)
    : impl(impl),
      socket(std::move(socket)),
      remote(tcp_handshake::RemoteOf(this->socket)),
      hello_timer(this->socket.get_executor()),
      greeting(impl->options.job_secret),
      ack_timer(this->socket.get_executor()) {
  staging.resize(kStagingBytes);
}

size_t TcpTransport::Impl::InStream::TakeStaged(char* dst, size_t n) {
  size_t k = std::min(n, buffered());
  if (k > 0) std::memcpy(dst, staging.data() + begin, k);
  begin += k;
  return k;
}

size_t TcpTransport::Impl::InStream::Skip(size_t n) {
  const size_t k = std::min(n, buffered());
  begin += k;
  return k;
}

// Processes every complete message already staged, then reads more. Runs on the strand; only one
// read is outstanding per connection, so this is never entered twice at once.
void TcpTransport::Impl::InStream::Pump() {
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

void TcpTransport::Impl::InStream::ReadMore() {
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

void TcpTransport::Impl::InStream::ReadMeta(size_t got) {
  asio::async_read(socket, asio::buffer(pending.meta.data() + got, frame.meta_len - got),
                   [self = shared_from_this()](const std::error_code& ec, size_t) {
                     if (ec) return self->Fail(ec);
                     if (self->StartBody()) self->Pump();
                   });
}

bool TcpTransport::Impl::InStream::StartBody() {
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
bool TcpTransport::Impl::InStream::BodyTooLong(size_t n) {
  if (!impl->body_limit) return false;
  const size_t limit = impl->body_limit(pending.header);
  if (n <= limit) return false;
  pending.header.flags |= kFlagBodyRefused;
  pending.meta = BodyRefusal(n, limit);
  return true;
}

// Reads and drops the rest of a refused body, through the (empty) staging buffer.
void TcpTransport::Impl::InStream::DiscardMore() {
  socket.async_read_some(asio::buffer(staging.data(), std::min(discard_left, staging.size())),
                         [self = shared_from_this()](const std::error_code& ec, size_t k) {
                           if (ec) return self->Fail(ec);
                           self->discard_left -= k;
                           if (self->discard_left > 0) return self->DiscardMore();
                           self->Dispatch();
                           self->Pump();
                         });
}

Body TcpTransport::Impl::InStream::Destination(size_t n) {
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
bool TcpTransport::Impl::InStream::StartRemoteBody() {
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

bool TcpTransport::Impl::InStream::CopyRemoteBody() {
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

void TcpTransport::Impl::InStream::Write(std::string bytes) {
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

void TcpTransport::Impl::InStream::Dispatch() {
  Message msg = std::move(pending);
  pending = Message{};
  if (LogEnabled(LogLevel::kMessages)) DTRAIN_LOG(kMessages) << "recv " << Describe(msg);
  if (!greeted) return OnHandshake(std::move(msg));
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
      incarnation.store(impl->IncarnationOf(msg.header.sender));
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

void TcpTransport::Impl::InStream::Fail(const std::error_code& ec) {
  if (said_bye || impl->shutting_down.load() || ec == asio::error::operation_aborted) {
    Close();
    return;
  }
  // Even a clean close may be the network's doing (a reset reads as one once a write has taken the
  // error): with PS_RESEND the peer gets the window to resume. If its process ended, our own link
  // to it finds nothing listening and reports it at once.
  Lose(ec == asio::error::eof ? std::string("its connection closed (the process exited or died)")
                              : "reading from it failed: " + ec.message(),
       true);
}

void TcpTransport::Impl::InStream::Fail(const std::string& reason) { Lose(reason, false); }

void TcpTransport::Impl::InStream::Lose(const std::string& reason, bool may_resume) {
  // A connection that never completed the handshake is no node of the job (a port scan, a health
  // check, a stray client): its end or its garbage must not count as a member's failure.
  if (!greeted) {
    Close();
    return impl->DropStranger(remote, reason);
  }
  // One that another connection has taken over from ends quietly.
  if (!Carries()) return Close();
  if (may_resume && inbound && peer.load() != kNoNode) return AwaitResume(reason);
  Close();
  impl->ReportLost(peer.load(), incarnation.load(), remote, reason);
}

void TcpTransport::Impl::InStream::Close() {
  std::error_code ignored;
  hello_timer.cancel();
  ack_timer.cancel();
  socket.close(ignored);
  impl->Forget(shared_from_this());
}

void TcpTransport::Impl::InStream::Abort() {
  std::error_code ignored;
  hello_timer.cancel();  // ends a wait for the peer to resume (PS_RESEND)
  socket.close(ignored);
}

}  // namespace dtrain::transport

// TcpTransport's writing side: one OutStream per TCP connection we opened (out_stream.h), and,
// with PS_RESEND, the re-establishing of one that broke.
#include "transport/tcp/out_stream.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"

namespace dtrain::transport {

using asio::ip::tcp;
using OutStream = TcpTransport::Impl::OutStream;

OutStream::OutStream(Impl* impl, NodeId peer, Endpoint endpoint, int index, tcp::socket s,
                     const tcp_handshake::Welcome& welcome)
    : impl(impl),
      peer(peer),
      incarnation(impl->IncarnationOf(peer)),
      endpoint(std::move(endpoint)),
      index(index),
      socket(std::make_shared<tcp::socket>(std::move(s))),
      remote(tcp_handshake::RemoteOf(*socket)),
      tuner(impl->SendBufferTunerFor(*socket)),
      resend(welcome.resend),
      direct(welcome.direct) {}

void OutStream::Encode(Item& item) {
  item.msg.header.flags &= ~kFlagRemoteBody;
  item.remote_body = false;
  if (direct && item.msg.body.size >= impl->options.direct_min_bytes) {
    item.msg.header.flags |= kFlagRemoteBody;
    item.remote_body = true;
    item.descriptor = {reinterpret_cast<uint64_t>(item.msg.body.data), next_token++};
    // Registered before the descriptor can leave: the acknowledgement may come back before the
    // write's completion handler runs.
    awaiting_ack[item.descriptor[1]] = item.msg.body;
  }
  item.header = EncodeHeader(item.msg.header, item.msg.meta.size(), item.msg.body.size);
}

void OutStream::Enqueue(Message&& msg) {
  std::unique_lock<std::mutex> lock(mutex);
  if (state == State::kFailed) {
    const std::string where = remote;
    lock.unlock();
    impl->ReportLost(peer, incarnation, where, "the connection to it failed earlier");
    return;
  }
  Item item;
  item.msg = std::move(msg);
  Encode(item);
  const int priority = PlaceInLine(item.msg);
  waiting.emplace(priority, std::move(item));
  // While reconnecting, messages wait here and go out once the stream is re-established.
  if (state == State::kLive && !writing) StartWrite();
}

namespace {

// The messages that may overtake others: requests for values (push, pull, pushpull), and a
// server's answers to them.
enum class Kind { kValueRequest, kValueReply, kOther };

Kind KindOf(const Message& msg) {
  if (!IsValueCommand(msg.header.command)) return Kind::kOther;
  return msg.header.is_response() ? Kind::kValueReply : Kind::kValueRequest;
}

}  // namespace

// A value request overtakes waiting value requests of lower priority for other keys, and a value
// reply waiting value replies; neither overtakes one for the same key (a pull must see the push
// before it, and a worker its answers in that order), and no other message (a command, its reply,
// the goodbye) overtakes anything or is overtaken: returns the priority that keeps those rules.
int OutStream::PlaceInLine(const Message& msg) const {
  int priority = msg.header.priority;
  const Kind kind = KindOf(msg);
  for (const auto& [ahead, item] : waiting) {
    if (kind == Kind::kOther || KindOf(item.msg) != kind || item.msg.header.key == msg.header.key) {
      priority = std::min(priority, ahead);
    }
  }
  return priority;
}

// Deque elements stay put while others are pushed, so the buffers remain valid; a message gets its
// sequence number when its writing starts, so that the numbers follow the order on the wire.
void OutStream::StartWrite() {
  writing = true;
  if (written == queue.size()) {
    auto next = waiting.extract(waiting.begin());
    next.mapped().seq = next_seq++;
    queue.push_back(std::move(next.mapped()));
  }
  Item& item = queue[written];
  item.ack_first = false;
  if (const uint64_t count = reverse_delivered.load(); resend && count > reverse_sent) {
    Header h;
    h.command = Command::kAck;
    h.sender = item.msg.header.sender;
    h.recipient = item.msg.header.recipient;
    h.request_id = count;
    item.ack = EncodeHeader(h, 0, 0);
    item.ack_first = true;
    reverse_sent = count;
  }
  std::array<asio::const_buffer, 4> buffers{
      asio::buffer(item.ack.data(), item.ack_first ? item.ack.size() : 0),
      asio::buffer(item.header), asio::buffer(item.msg.meta),
      item.remote_body
          ? asio::buffer(item.descriptor)
          : asio::buffer(static_cast<const void*>(item.msg.body.data), item.msg.body.size)};
  asio::async_write(*socket, buffers,
                    [self = shared_from_this(), gen = generation](
                        const std::error_code& ec, size_t n) { self->OnWritten(gen, ec, n); });
}

void OutStream::OnWritten(uint64_t gen, const std::error_code& ec, size_t bytes) {
  std::unique_lock<std::mutex> lock(mutex);
  if (gen != generation) return;  // an abandoned connection's write
  if (ec) {
    lock.unlock();
    return OnBroken(gen, "sending to it failed: " + ec.message());
  }
  if (tuner) tuner->AfterWrite(bytes);
  if (resend) {
    ++written;  // kept until the peer says it has it
    DropAcknowledged();
  } else {
    queue.pop_front();
  }
  if (written < queue.size() || !waiting.empty()) return StartWrite();
  writing = false;
  drained.notify_all();
}

bool OutStream::Drained() const {
  return written == queue.size() && waiting.empty() && awaiting_ack.empty();
}

void OutStream::DropAcknowledged() {
  while (written > 0 && queue.front().seq < acked) {
    queue.pop_front();
    --written;
  }
}

void OutStream::ReadAcks() {
  std::lock_guard<std::mutex> lock(mutex);
  ReadAcksOn(socket, generation);
}

// Reads the peer's acknowledgements (8-byte words: copied same-host bodies, and with PS_RESEND
// counts of messages received), and on every stream notices at once when the peer's end closes or
// resets (a stream we only wrote on would learn it at our next write, which may be long: the
// scheduler writes to a node rarely).
void OutStream::ReadAcksOn(std::shared_ptr<tcp::socket> on, uint64_t gen) {
  on->async_read_some(asio::buffer(ack_buffer.data() + ack_have, ack_buffer.size() - ack_have),
                      [self = shared_from_this(), on, gen](const std::error_code& ec, size_t n) {
                        self->OnAcks(on, gen, ec, n);
                      });
}

void OutStream::OnAcks(const std::shared_ptr<tcp::socket>& on, uint64_t gen,
                       const std::error_code& ec, size_t n) {
  if (ec == asio::error::operation_aborted) return;  // we closed it
  if (ec) {
    return OnBroken(gen, ec == asio::error::eof
                             ? std::string("its connection closed (the process exited or died)")
                             : "reading from it failed: " + ec.message());
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (gen != generation) return;
  ack_have += n;
  const size_t whole = ack_have / 8 * 8;
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t word;
    std::memcpy(&word, ack_buffer.data() + i, 8);
    if ((word & kDeliveredBit) == 0) {
      awaiting_ack.erase(word);
    } else {
      AdvanceAcked(word & ~kDeliveredBit);
    }
  }
  if (Drained()) drained.notify_all();
  std::memmove(ack_buffer.data(), ack_buffer.data() + whole, ack_have - whole);
  ack_have -= whole;
  ReadAcksOn(on, gen);
}

void OutStream::Acknowledge(uint64_t count) {
  std::lock_guard<std::mutex> lock(mutex);
  AdvanceAcked(count);
}

// A count beyond what was sent is the peer's error, and one below what it said before changes
// nothing: both are ignored.
void OutStream::AdvanceAcked(uint64_t count) {
  if (count <= acked || count > next_seq) return;
  acked = count;
  DropAcknowledged();
}

bool OutStream::WaitDrained(const Deadline& deadline) {
  std::unique_lock<std::mutex> lock(mutex);
  return drained.wait_until(lock, deadline.at(),
                            [this] { return state == State::kFailed || Drained(); });
}

void OutStream::Close() {
  std::lock_guard<std::mutex> lock(mutex);
  state = State::kFailed;
  ++generation;
  asio::post(socket->get_executor(), [on = socket] {
    std::error_code ignored;
    on->close(ignored);
  });
}

void OutStream::OnBroken(uint64_t gen, const std::string& reason) {
  std::unique_lock<std::mutex> lock(mutex);
  if (gen != generation || state != State::kLive) return;
  const bool retry = resend && !impl->shutting_down.load() && !impl->Departed(peer);
  ++generation;  // the handlers of the broken connection are ignored from now on
  writing = false;
  awaiting_ack.clear();
  old_closed = false;
  state = retry ? State::kReconnecting : State::kFailed;
  // Closed on its strand; until then a write may still read the queue, so the queue is changed
  // only once this has run.
  asio::post(socket->get_executor(), [self = shared_from_this(), on = socket] {
    std::error_code ignored;
    on->close(ignored);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->old_closed = true;
    if (self->state == State::kFailed) {
      self->queue.clear();
      self->waiting.clear();
      self->written = 0;
    }
    self->drained.notify_all();
  });
  const std::string where = remote;
  lock.unlock();
  if (!retry) return impl->ReportLost(peer, incarnation, where, reason);
  DTRAIN_LOG(kWarning) << "the connection to node " << peer << " at " << where << " broke ("
                       << reason << "); re-establishing it (PS_RESEND) for up to "
                       << impl->options.resend_window.count() << " ms";
  {
    // Checked under the lock Shutdown sets it with, so that no thread starts after Shutdown has
    // collected the ones to join.
    std::lock_guard<std::mutex> impl_lock(impl->mutex);
    if (!impl->shutting_down.load()) {
      impl->reconnectors.emplace_back(
          [self = shared_from_this(), reason] { self->Reconnect(reason); });
      return;
    }
  }
  GiveUp("the transport shut down");
}

void OutStream::Reconnect(std::string reason) {
  const Deadline window(impl->options.resend_window);
  const auto started = Clock::now();
  {
    std::unique_lock<std::mutex> lock(mutex);
    drained.wait_until(lock, window.at(), [this] { return old_closed; });
  }
  Duration pause{50};
  std::string last = "no attempt was made";
  for (int attempts = 1;; ++attempts) {
    {
      std::unique_lock<std::mutex> lock(impl->mutex);
      impl->stopping.wait_for(lock, std::min(pause, window.left()),
                              [this] { return impl->shutting_down.load(); });
    }
    if (impl->shutting_down.load()) return GiveUp("the transport shut down while reconnecting");
    if (impl->Departed(peer)) return GiveUp("it said goodbye");
    if (window.passed()) {
      return GiveUp(reason + "; it could not be reached again within " +
                    std::to_string(impl->options.resend_window.count()) +
                    " ms (DTRAIN_RESEND_WINDOW_MS; " + std::to_string(attempts - 1) +
                    " attempts, the last: " + last + ")");
    }
    pause = std::min(pause * 2, impl->options.resend_timeout);
    NodeId self_id;
    {
      std::lock_guard<std::mutex> lock(impl->mutex);
      self_id = impl->self;
    }
    const Deadline attempt(
        std::min(window.left(), std::max(impl->options.resend_timeout, Duration(1000))));
    try {
      auto [fresh, welcome] = impl->Open(peer, endpoint, self_id, {index, true}, attempt);
      std::string why;
      if (!Resume(std::move(fresh), welcome, &why)) return GiveUp(reason + "; " + why);
      DTRAIN_LOG(kWarning) << "re-established the connection to node " << peer << " at "
                           << endpoint.ToString() << " after "
                           << std::chrono::duration_cast<Duration>(Clock::now() - started).count()
                           << " ms (attempt " << attempts << "); " << why;
      return;
    } catch (const tcp_handshake::NobodyListens&) {
      return GiveUp(reason + "; then nothing listened at " + endpoint.ToString() +
                    " any more (its process has ended)");
    } catch (const tcp_handshake::Refused& e) {
      return GiveUp(reason + "; reconnecting was refused: " + e.what());
    } catch (const Error& e) {
      last = e.what();
    }
  }
}

bool OutStream::Resume(tcp::socket fresh, const tcp_handshake::Welcome& welcome, std::string* why) {
  std::lock_guard<std::mutex> lock(mutex);
  if (state != State::kReconnecting) return true;  // closed meanwhile: nothing to resend
  if (!welcome.resend) {
    *why = "it no longer acknowledges what it receives (PS_RESEND=0 there?)";
    return false;
  }
  if (welcome.delivered < acked || welcome.delivered > next_seq) {
    *why = "it does not know this stream any more (it says it received " +
           std::to_string(welcome.delivered) + " messages; " + std::to_string(acked) +
           " were acknowledged and " + std::to_string(next_seq) + " sent)";
    return false;
  }
  acked = welcome.delivered;
  while (!queue.empty() && queue.front().seq < acked) queue.pop_front();
  written = 0;
  direct = welcome.direct;
  awaiting_ack.clear();
  for (Item& item : queue) Encode(item);
  for (auto& [priority, item] : waiting) Encode(item);
  socket = std::make_shared<tcp::socket>(std::move(fresh));
  remote = tcp_handshake::RemoteOf(*socket);
  tuner = impl->SendBufferTunerFor(*socket);
  ack_have = 0;
  ++generation;
  state = State::kLive;
  *why = std::to_string(queue.size()) + " message(s) it had not received are being resent";
  ReadAcksOn(socket, generation);
  if (!queue.empty() || !waiting.empty()) StartWrite();
  return true;
}

void OutStream::GiveUp(const std::string& reason) {
  std::string where;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (state != State::kReconnecting) return;
    state = State::kFailed;
    queue.clear();
    waiting.clear();
    written = 0;
    awaiting_ack.clear();
    drained.notify_all();
    where = remote;
  }
  impl->ReportLost(peer, incarnation, where, reason);
}

}  // namespace dtrain::transport

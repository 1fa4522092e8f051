// InStream's part in resending (PS_RESEND): counting what the stream delivered, acknowledging it,
// and waiting for a broken stream to resume (see in_stream.h).
#include "common/logging.h"
#include "transport/tcp/in_stream.h"
#include "transport/tcp/out_stream.h"

namespace dtrain::transport {

// Makes this connection the carrier of its stream: a resumed stream continues its count, a new one
// starts at 0. Returns how many messages the stream has delivered.
uint64_t TcpTransport::Impl::InStream::Carry(NodeId sender, bool resume) {
  std::shared_ptr<Inbound> state;
  if (sender >= 0) {
    std::lock_guard<std::mutex> lock(impl->mutex);
    auto& slot = impl->inbound[{sender, stream_index}];
    if (!slot || !resume) slot = std::make_shared<Inbound>();
    state = slot;
  } else {
    state = std::make_shared<Inbound>();  // registered once the sender's id is known
  }
  std::lock_guard<std::mutex> lock(state->mutex);
  state->carrier = this;
  inbound = state;
  return state->delivered;
}

// The stream we write back to the peer on with this stream's index: requests and their replies take
// the same index both ways, so the counts it carries are what the peer waits on.
std::shared_ptr<TcpTransport::Impl::OutStream> TcpTransport::Impl::InStream::Reverse() {
  if (auto out = reverse.lock()) return out;
  const NodeId from = peer.load();
  if (from == kNoNode) return nullptr;
  std::lock_guard<std::mutex> lock(impl->mutex);
  auto it = impl->links.find(from);
  if (it == impl->links.end() || stream_index >= static_cast<int>(it->second.size())) {
    return nullptr;
  }
  reverse = it->second[stream_index];
  return it->second[stream_index];
}

// Whether this connection still carries its stream (not resumed on another since).
bool TcpTransport::Impl::InStream::Carries() {
  if (!inbound) return true;
  std::lock_guard<std::mutex> lock(inbound->mutex);
  return inbound->carrier == this;
}

// Counts an arriving message and sees that the count reaches the sender soon; false if another
// connection carries the stream now, and this one must deliver nothing more (what it still held is
// resent there).
bool TcpTransport::Impl::InStream::Count(size_t body_bytes) {
  uint64_t delivered;
  {
    std::lock_guard<std::mutex> lock(inbound->mutex);
    if (inbound->carrier != this) {
      Close();
      return false;
    }
    delivered = ++inbound->delivered;
  }
  if (auto out = Reverse()) out->reverse_delivered.store(delivered);
  const AckSchedule::Decision decision = acks.OnMessage(body_bytes);
  if (decision.now) WriteDelivered(delivered);
  if (decision.arm_timer) {
    ack_timer.expires_after(AckSchedule::kDelay);
    ack_timer.async_wait(
        [self = shared_from_this()](const std::error_code& ec) { self->OnAckTimer(ec); });
  }
  return true;
}

void TcpTransport::Impl::InStream::OnAckTimer(const std::error_code& ec) {
  acks.OnTimer();
  if (ec || !socket.is_open()) return;
  uint64_t delivered;
  {
    std::lock_guard<std::mutex> lock(inbound->mutex);
    if (inbound->carrier != this) return;
    delivered = inbound->delivered;
  }
  WriteDelivered(delivered);
}

// The stream's count of messages received, on the acknowledgement channel.
void TcpTransport::Impl::InStream::WriteDelivered(uint64_t delivered) {
  const uint64_t word = delivered | kDeliveredBit;
  Write(std::string(reinterpret_cast<const char*>(&word), sizeof word));
}

// The peer's side re-establishes the stream if it can; it is lost only if it has not within the
// window. The connection stays among the incoming ones so that shutdown ends the wait.
void TcpTransport::Impl::InStream::AwaitResume(const std::string& reason) {
  std::error_code ignored;
  socket.close(ignored);
  const auto window = impl->options.resend_window;
  DTRAIN_LOG(kWarning) << "lost the connection from node " << peer.load() << " at " << remote
                       << " (" << reason << "); waiting up to " << window.count()
                       << " ms for it to reconnect (PS_RESEND)";
  hello_timer.expires_after(window);
  hello_timer.async_wait([self = shared_from_this(), reason, window](const std::error_code& ec) {
    const bool still_carrier = self->Carries();
    self->Close();
    if (ec || !still_carrier) return;  // shut down, or resumed on another connection
    self->impl->ReportLost(self->peer.load(), self->incarnation.load(), self->remote,
                           reason + "; it did not reconnect within " +
                               std::to_string(window.count()) + " ms (DTRAIN_RESEND_WINDOW_MS)");
  });
}

}  // namespace dtrain::transport

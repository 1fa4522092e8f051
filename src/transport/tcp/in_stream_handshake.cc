// InStream's handshake: the accepting side, driven by AcceptorGreeting (see in_stream.h).
#include "auth/job_auth.h"
#include "transport/tcp/in_stream.h"

namespace dtrain::transport {

// A connection must introduce itself within hello_timeout, or it is closed: a stranger that
// connects and says nothing (or half a frame) must not hold a descriptor for ever.
void TcpTransport::Impl::InStream::StartHelloDeadline() {
  hello_timer.expires_after(impl->options.hello_timeout);
  hello_timer.async_wait([self = shared_from_this()](const std::error_code& ec) {
    if (ec || self->greeted || !self->socket.is_open()) return;
    self->impl->DropStranger(self->remote,
                             "it did not complete the handshake within " +
                                 std::to_string(self->impl->options.hello_timeout.count()) +
                                 " ms (DTRAIN_HELLO_TIMEOUT_MS)");
    std::error_code ignored;
    self->socket.close(ignored);  // the pending read ends with operation_aborted: no report
  });
}

void TcpTransport::Impl::InStream::OnHandshake(Message&& msg) {
  tcp_handshake::GreetingStep step = greeting.OnMessage(std::move(msg));
  using Kind = tcp_handshake::GreetingStep::Kind;
  switch (step.kind) {
    case Kind::kAnswer:
      return Write(std::move(step.frame));
    case Kind::kRefuse:
      return Refuse(step.frame, step.reason);
    case Kind::kGreet:
      return Greet(step.hello);
    case Kind::kDrop:
      return Fail(step.reason);
  }
}

// Answers a connection that is no member with the reason (so that a misconfigured node of the job
// learns what is wrong), logs it as a stranger's, and closes once the answer is written.
void TcpTransport::Impl::InStream::Refuse(const std::string& frame, const std::string& reason) {
  if (refused) return;
  refused = true;
  impl->DropStranger(remote, reason);
  Write(frame);
}

// This connection's two ends, for the kernel's word on who holds the other one (IPv4 only: the
// same-host path is off for anything else).
same_host::ConnectionEnds TcpTransport::Impl::InStream::Ends() const {
  same_host::ConnectionEnds ends;
  std::error_code e1, e2;
  const auto remote_end = socket.remote_endpoint(e1);
  const auto local_end = socket.local_endpoint(e2);
  if (e1 || e2 || !remote_end.address().is_v4() || !local_end.address().is_v4()) return ends;
  ends.peer_address = remote_end.address().to_v4().to_uint();
  ends.peer_port = remote_end.port();
  ends.our_address = local_end.address().to_v4().to_uint();
  ends.our_port = local_end.port();
  return ends;
}

// The handshake is complete: the connection belongs to the node its hello named; say whether the
// same-host fast path can be used and, with PS_RESEND, where the stream's count stands.
void TcpTransport::Impl::InStream::Greet(const Message& first) {
  greeted = true;
  hello_timer.cancel();
  if (first.header.sender >= 0) {
    incarnation.store(impl->IncarnationOf(first.header.sender));
    peer.store(first.header.sender);
  }
  if (impl->options.same_host_direct && !first.meta.empty()) {
    sender_pid = same_host::ProbeHello(first.meta, Ends());
  }
  std::optional<uint64_t> delivered;
  if (impl->options.resend) {
    if (const std::optional<int> index = tcp_handshake::RequestedStream(first.meta)) {
      stream_index = *index;
      const bool resume = auth::WordValue(first.meta, "resume") == "1";
      delivered = Carry(first.header.sender, resume);
    }
  }
  Write(tcp_handshake::WelcomeFrame(sender_pid != 0, delivered));
}

}  // namespace dtrain::transport

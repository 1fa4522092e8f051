// The accepting side of a TCP stream's handshake (the exchange is drawn in tcp_transport.h), as a
// pure state machine: it is fed the messages a fresh connection sends before it is greeted and
// says what to do with each. The InStream that reads the connection does the I/O; this part can be
// tested without a socket.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "auth/handshake.h"
#include "transport/message.h"

namespace dtrain::transport::tcp_handshake {

// What the acceptor does with one message of the handshake.
struct GreetingStep {
  enum class Kind {
    kAnswer,  // write `frame` (the challenge) and wait for the connector's proof
    kRefuse,  // write `frame` (the refusal, coded for the connector), log `reason`, close
    kGreet,   // the connection belongs to the node `hello` names: answer with a welcome
    kDrop,    // it does not speak the protocol: close without an answer, log `reason`
  };
  Kind kind = Kind::kRefuse;
  std::string frame;
  std::string reason;
  Message hello;
};

class AcceptorGreeting {
 public:
  // `secret` is DTRAIN_JOB_SECRET here; empty when the job runs without one.
  explicit AcceptorGreeting(std::string secret);

  // The next message from a connection not yet greeted. Anything but a hello, a second hello
  // before the proof, or a proof that does not check is refused.
  GreetingStep OnMessage(Message&& msg);

 private:
  GreetingStep Refusal(const std::string& code, const std::string& reason) const;

  std::string secret_;
  std::optional<Message> hello_;  // with a secret: the hello, kept until its proof arrives
  std::optional<auth::AcceptorHandshake> challenge_;
};

// The stream index a hello asks the acceptor to count (PS_RESEND, the "stream" word): nullopt if
// it asks for none or the word is not a number of at most three digits.
std::optional<int> RequestedStream(const std::string& hello_meta);

// The welcome frame: whether the same-host path is on and, when the acceptor counts the stream
// (PS_RESEND), how many of its messages have been delivered.
std::string WelcomeFrame(bool direct, std::optional<uint64_t> delivered);

}  // namespace dtrain::transport::tcp_handshake

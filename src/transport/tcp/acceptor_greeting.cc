#include "transport/tcp/acceptor_greeting.h"

#include <utility>

#include "auth/job_auth.h"
#include "transport/tcp/tcp_handshake.h"

namespace dtrain::transport::tcp_handshake {

AcceptorGreeting::AcceptorGreeting(std::string secret) : secret_(std::move(secret)) {}

GreetingStep AcceptorGreeting::Refusal(const std::string& code, const std::string& reason) const {
  GreetingStep step;
  step.kind = GreetingStep::Kind::kRefuse;
  step.frame = Frame("dtrain-welcome 1 refused=" + code);
  step.reason = reason;
  return step;
}

GreetingStep AcceptorGreeting::OnMessage(Message&& msg) {
  if (msg.header.command != Command::kHello) {
    GreetingStep step;
    step.kind = GreetingStep::Kind::kDrop;
    step.reason = "it sent a message before completing the handshake";
    return step;
  }
  const std::string nonce = auth::WordValue(msg.meta, "nonce");
  if (secret_.empty()) {
    if (!nonce.empty()) {
      return Refusal("no-secret-here",
                     "it offered to authenticate, and DTRAIN_JOB_SECRET is not set here");
    }
    GreetingStep step;
    step.kind = GreetingStep::Kind::kGreet;
    step.hello = std::move(msg);
    return step;
  }
  if (!hello_) {
    challenge_.emplace(secret_, kLabels);
    const std::optional<auth::Challenge> sent = challenge_->OnHello(nonce);
    if (!sent) {
      return Refusal("secret-required",
                     "it did not authenticate (DTRAIN_JOB_SECRET is not set there, or it is no "
                     "node of this job)");
    }
    hello_ = std::move(msg);
    GreetingStep step;
    step.kind = GreetingStep::Kind::kAnswer;
    step.frame = Frame("dtrain-challenge 1 nonce=" + sent->nonce + " proof=" + sent->proof);
    return step;
  }
  if (!challenge_->Verify(auth::WordValue(msg.meta, "proof"),
                          {std::to_string(hello_->header.sender), hello_->meta})) {
    return Refusal("bad-proof", "it failed authentication (its DTRAIN_JOB_SECRET differs)");
  }
  GreetingStep step;
  step.kind = GreetingStep::Kind::kGreet;
  step.hello = std::move(*hello_);
  hello_.reset();
  return step;
}

std::optional<int> RequestedStream(const std::string& hello_meta) {
  const std::string index = auth::WordValue(hello_meta, "stream");
  if (index.empty() || index.size() > 3 ||
      index.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoi(index);
}

std::string WelcomeFrame(bool direct, std::optional<uint64_t> delivered) {
  std::string welcome = direct ? "dtrain-welcome 1 direct=1" : "dtrain-welcome 1 direct=0";
  if (delivered) welcome += " resend=1 delivered=" + std::to_string(*delivered);
  return Frame(welcome);
}

}  // namespace dtrain::transport::tcp_handshake

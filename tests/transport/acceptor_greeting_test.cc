// The accepting side's handshake and acknowledgement schedule as pure state machines, driven by
// what a connector sends (the connector's side is the real auth::ConnectorHandshake).
#include "transport/tcp/acceptor_greeting.h"

#include <gtest/gtest.h>

#include "auth/job_auth.h"
#include "transport/tcp/inbound_count.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/wire.h"

namespace dtrain::transport::tcp_handshake {
namespace {

using Kind = GreetingStep::Kind;
const std::string kSecret = "a-job-secret-long-enough-for-the-rule-0123456789";

Message Hello(NodeId sender, const std::string& meta) {
  Message msg;
  msg.header.command = Command::kHello;
  msg.header.sender = sender;
  msg.meta = meta;
  return msg;
}

// The words of a frame that Frame() built.
std::string MetaOf(const std::string& frame) { return frame.substr(kWireHeaderSize); }

TEST(AcceptorGreeting, WithoutASecretAHelloIsGreetedAsTheNodeItNames) {
  AcceptorGreeting greeting("");
  GreetingStep step = greeting.OnMessage(Hello(7, "stream=1"));
  ASSERT_EQ(step.kind, Kind::kGreet);
  EXPECT_EQ(step.hello.header.sender, 7);
  EXPECT_EQ(step.hello.meta, "stream=1");
}

TEST(AcceptorGreeting, AnythingButAHelloFirstIsDroppedWithoutAnAnswer) {
  AcceptorGreeting greeting(kSecret);
  Message push;
  push.header.command = Command::kPush;
  GreetingStep step = greeting.OnMessage(std::move(push));
  EXPECT_EQ(step.kind, Kind::kDrop);
  EXPECT_TRUE(step.frame.empty());
  EXPECT_NE(step.reason.find("before completing the handshake"), std::string::npos);
}

TEST(AcceptorGreeting, AnOfferToAuthenticateIsRefusedWhereThereIsNoSecret) {
  AcceptorGreeting greeting("");
  auth::ConnectorHandshake connector(kSecret, kLabels);
  GreetingStep step = greeting.OnMessage(Hello(3, "nonce=" + connector.nonce()));
  ASSERT_EQ(step.kind, Kind::kRefuse);
  EXPECT_EQ(auth::WordValue(MetaOf(step.frame), "refused"), "no-secret-here");
}

TEST(AcceptorGreeting, AHelloWithoutANonceIsRefusedWhereThereIsASecret) {
  AcceptorGreeting greeting(kSecret);
  GreetingStep step = greeting.OnMessage(Hello(3, "stream=0"));
  ASSERT_EQ(step.kind, Kind::kRefuse);
  EXPECT_EQ(auth::WordValue(MetaOf(step.frame), "refused"), "secret-required");
}

// Runs the exchange to the connector's proof; `claimed` is the sender id the proof is bound to.
GreetingStep Authenticate(AcceptorGreeting& greeting, const std::string& connector_secret,
                          NodeId sender, NodeId claimed) {
  auth::ConnectorHandshake connector(connector_secret, kLabels);
  const std::string meta = "stream=0 nonce=" + connector.nonce();
  GreetingStep challenge = greeting.OnMessage(Hello(sender, meta));
  EXPECT_EQ(challenge.kind, Kind::kAnswer);
  const std::string words = MetaOf(challenge.frame);
  std::optional<std::string> proof =
      connector.Answer(auth::WordValue(words, "nonce"), auth::WordValue(words, "proof"),
                       {std::to_string(claimed), meta});
  if (!proof) proof = std::string(64, '0');  // the connector rejected the acceptor: send junk
  return greeting.OnMessage(Hello(sender, "proof=" + *proof));
}

TEST(AcceptorGreeting, AConnectorThatProvesTheSecretIsGreetedAsItsHello) {
  AcceptorGreeting greeting(kSecret);
  GreetingStep step = Authenticate(greeting, kSecret, 5, 5);
  ASSERT_EQ(step.kind, Kind::kGreet);
  EXPECT_EQ(step.hello.header.sender, 5);
  EXPECT_EQ(auth::WordValue(step.hello.meta, "stream"), "0");  // the hello, not the proof
}

TEST(AcceptorGreeting, AProofBoundToAnotherClaimIsRefused) {
  AcceptorGreeting greeting(kSecret);
  GreetingStep step = Authenticate(greeting, kSecret, 5, 6);
  ASSERT_EQ(step.kind, Kind::kRefuse);
  EXPECT_EQ(auth::WordValue(MetaOf(step.frame), "refused"), "bad-proof");
}

TEST(AcceptorGreeting, AnotherSecretIsRefused) {
  AcceptorGreeting greeting(kSecret);
  GreetingStep step = Authenticate(greeting, kSecret + "-other", 5, 5);
  ASSERT_EQ(step.kind, Kind::kRefuse);
  EXPECT_EQ(auth::WordValue(MetaOf(step.frame), "refused"), "bad-proof");
}

TEST(AcceptorGreeting, TheStreamWordMustBeASmallNumber) {
  EXPECT_EQ(RequestedStream("nonce=ab stream=2"), 2);
  EXPECT_EQ(RequestedStream("stream=999"), 999);
  EXPECT_EQ(RequestedStream("stream=1000"), std::nullopt);
  EXPECT_EQ(RequestedStream("stream=-1"), std::nullopt);
  EXPECT_EQ(RequestedStream("stream=1x"), std::nullopt);
  EXPECT_EQ(RequestedStream("resume=1"), std::nullopt);
}

TEST(AcceptorGreeting, TheWelcomeSaysTheSameHostPathAndTheCount) {
  EXPECT_EQ(MetaOf(WelcomeFrame(false, std::nullopt)), "dtrain-welcome 1 direct=0");
  EXPECT_EQ(MetaOf(WelcomeFrame(true, uint64_t{12})),
            "dtrain-welcome 1 direct=1 resend=1 delivered=12");
}

TEST(AckSchedule, TheFirstMessageArmsTheTimerAndLargeVolumesAreAcknowledgedAtOnce) {
  AckSchedule acks;
  AckSchedule::Decision first = acks.OnMessage(1 << 20);
  EXPECT_TRUE(first.arm_timer);
  EXPECT_FALSE(first.now);
  AckSchedule::Decision second = acks.OnMessage(1 << 20);
  EXPECT_FALSE(second.arm_timer);  // one timer at a time
  EXPECT_FALSE(second.now);
  AckSchedule::Decision big = acks.OnMessage(AckSchedule::kBytes);
  EXPECT_TRUE(big.now);
  EXPECT_FALSE(acks.OnMessage(AckSchedule::kBytes - 1).now);  // the count restarted at the ack
  acks.OnTimer();
  AckSchedule::Decision after = acks.OnMessage(1);
  EXPECT_TRUE(after.arm_timer);
  EXPECT_FALSE(after.now);  // the timer's acknowledgement reset the bytes
}

}  // namespace
}  // namespace dtrain::transport::tcp_handshake

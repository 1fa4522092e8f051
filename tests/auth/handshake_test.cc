#include "auth/handshake.h"

#include <gtest/gtest.h>

#include <string>

#include "auth/job_auth.h"

namespace dtrain::auth {
namespace {

constexpr HandshakeLabels kLabels{"test-acceptor", "test-connector"};
const std::string kSecret = "0123456789abcdef-secret";

TEST(Handshake, BothSidesAgreeWithTheSameSecret) {
  ConnectorHandshake connector(kSecret, kLabels);
  AcceptorHandshake acceptor(kSecret, kLabels);
  auto challenge = acceptor.OnHello(connector.nonce());
  ASSERT_TRUE(challenge.has_value());
  EXPECT_TRUE(IsNonce(challenge->nonce));
  EXPECT_NE(challenge->nonce, connector.nonce());
  auto proof = connector.Answer(challenge->nonce, challenge->proof, {"7", "hello meta"});
  ASSERT_TRUE(proof.has_value());
  EXPECT_TRUE(acceptor.Verify(*proof, {"7", "hello meta"}));
}

TEST(Handshake, TheConnectorRejectsAnAcceptorWithAnotherSecret) {
  ConnectorHandshake connector(kSecret, kLabels);
  AcceptorHandshake stranger("another-secret-of-16+", kLabels);
  auto challenge = stranger.OnHello(connector.nonce());
  ASSERT_TRUE(challenge.has_value());
  EXPECT_FALSE(connector.Answer(challenge->nonce, challenge->proof, {"1"}).has_value());
}

TEST(Handshake, TheAcceptorRejectsAConnectorWithAnotherSecret) {
  ConnectorHandshake stranger("another-secret-of-16+", kLabels);
  AcceptorHandshake acceptor(kSecret, kLabels);
  auto challenge = acceptor.OnHello(stranger.nonce());
  ASSERT_TRUE(challenge.has_value());
  // The stranger cannot check the challenge; it answers with a proof under its own secret.
  const std::string forged =
      Proof("another-secret-of-16+", kLabels.connector, {challenge->nonce, stranger.nonce(), "1"});
  EXPECT_FALSE(acceptor.Verify(forged, {"1"}));
}

TEST(Handshake, AProofIsBoundToTheClaimItWasMadeFor) {
  ConnectorHandshake connector(kSecret, kLabels);
  AcceptorHandshake acceptor(kSecret, kLabels);
  auto challenge = acceptor.OnHello(connector.nonce());
  ASSERT_TRUE(challenge.has_value());
  auto proof = connector.Answer(challenge->nonce, challenge->proof, {"1"});
  ASSERT_TRUE(proof.has_value());
  EXPECT_FALSE(acceptor.Verify(*proof, {"2"}));
  EXPECT_TRUE(acceptor.Verify(*proof, {"1"}));
}

TEST(Handshake, TheAcceptorsProofCannotBeReflectedAsTheConnectors) {
  // A relay that hands the acceptor's own proof back gets nowhere: the labels differ by direction.
  ConnectorHandshake connector(kSecret, kLabels);
  AcceptorHandshake acceptor(kSecret, kLabels);
  auto challenge = acceptor.OnHello(connector.nonce());
  ASSERT_TRUE(challenge.has_value());
  EXPECT_FALSE(acceptor.Verify(challenge->proof, {}));
}

TEST(Handshake, AProofFromAnEarlierExchangeDoesNotCheckInANewOne) {
  ConnectorHandshake connector(kSecret, kLabels);
  AcceptorHandshake first(kSecret, kLabels);
  auto old_challenge = first.OnHello(connector.nonce());
  ASSERT_TRUE(old_challenge.has_value());
  auto old_proof = connector.Answer(old_challenge->nonce, old_challenge->proof, {"1"});
  ASSERT_TRUE(old_proof.has_value());
  AcceptorHandshake second(kSecret, kLabels);
  ASSERT_TRUE(second.OnHello(connector.nonce()).has_value());  // a fresh acceptor nonce
  EXPECT_FALSE(second.Verify(*old_proof, {"1"}));
}

TEST(Handshake, ProtocolsWithOtherLabelsDoNotAcceptEachOthersProofs) {
  ConnectorHandshake connector(kSecret, {"other-acceptor", "other-connector"});
  AcceptorHandshake acceptor(kSecret, kLabels);
  auto challenge = acceptor.OnHello(connector.nonce());
  ASSERT_TRUE(challenge.has_value());
  EXPECT_FALSE(connector.Answer(challenge->nonce, challenge->proof, {"1"}).has_value());
}

TEST(Handshake, MalformedNoncesAndEarlyProofsAreRefused) {
  AcceptorHandshake acceptor(kSecret, kLabels);
  EXPECT_FALSE(acceptor.Verify(std::string(64, 'a'), {"1"}));  // no challenge yet
  EXPECT_FALSE(acceptor.OnHello("").has_value());
  EXPECT_FALSE(acceptor.OnHello(std::string(64, 'G')).has_value());
  EXPECT_FALSE(acceptor.OnHello(std::string(63, 'a')).has_value());
  ConnectorHandshake connector(kSecret, kLabels);
  EXPECT_FALSE(connector.Answer("not a nonce", std::string(64, 'a'), {"1"}).has_value());
  EXPECT_THROW(ConnectorHandshake("", kLabels), std::logic_error);
  EXPECT_THROW(AcceptorHandshake("", kLabels), std::logic_error);
}

}  // namespace
}  // namespace dtrain::auth

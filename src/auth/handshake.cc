#include "auth/handshake.h"

#include <stdexcept>
#include <vector>

#include "auth/job_auth.h"

namespace dtrain::auth {
namespace {

std::string ProofOver(std::string_view secret, std::string_view label,
                      std::initializer_list<std::string_view> nonces,
                      std::initializer_list<std::string_view> context) {
  std::vector<std::string_view> parts(nonces);
  parts.insert(parts.end(), context.begin(), context.end());
  return Proof(secret, label, parts);
}

std::string RequireSecret(std::string secret) {
  // A programming error: callers decide whether the job authenticates before making one.
  if (secret.empty()) throw std::logic_error("a handshake needs a job secret");
  return secret;
}

}  // namespace

bool IsNonce(std::string_view text) {
  return text.size() == 64 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

ConnectorHandshake::ConnectorHandshake(std::string secret, HandshakeLabels labels)
    : secret_(RequireSecret(std::move(secret))), labels_(labels), nonce_(NewNonce()) {}

std::optional<std::string> ConnectorHandshake::Answer(
    std::string_view their_nonce, std::string_view their_proof,
    std::initializer_list<std::string_view> context) const {
  if (!IsNonce(their_nonce)) return std::nullopt;
  const std::string expected = Proof(secret_, labels_.acceptor, {nonce_, their_nonce});
  if (!ProofsEqual(expected, their_proof)) return std::nullopt;
  return ProofOver(secret_, labels_.connector, {their_nonce, nonce_}, context);
}

AcceptorHandshake::AcceptorHandshake(std::string secret, HandshakeLabels labels)
    : secret_(RequireSecret(std::move(secret))), labels_(labels) {}

std::optional<Challenge> AcceptorHandshake::OnHello(std::string_view connector_nonce) {
  if (!IsNonce(connector_nonce)) return std::nullopt;
  connector_nonce_ = connector_nonce;
  acceptor_nonce_ = NewNonce();
  return auth::Challenge{acceptor_nonce_,
                         Proof(secret_, labels_.acceptor, {connector_nonce_, acceptor_nonce_})};
}

bool AcceptorHandshake::Verify(std::string_view proof,
                               std::initializer_list<std::string_view> context) const {
  if (!challenged()) return false;
  return ProofsEqual(
      ProofOver(secret_, labels_.connector, {acceptor_nonce_, connector_nonce_}, context), proof);
}

}  // namespace dtrain::auth

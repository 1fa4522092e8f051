// The job's challenge-response, both sides, as one state machine that every listener and every
// connecting side uses (the TCP transport and the Gloo rendezvous store frame it differently; the
// exchange and the proofs are the same).
//
//   connector                                   acceptor
//   hello: its nonce Nc (and what it says of itself: the context)
//                                  ----------->
//                                               OnHello(Nc): a fresh nonce Na and
//                                               P_a = HMAC(secret, acceptor label, Nc, Na)
//                                  <-----------
//   Answer(Na, P_a): checks P_a, then
//   P_c = HMAC(secret, connector label, Na, Nc, context...)
//                                  ----------->
//                                               Verify(P_c, context...)
//
// The nonces are fresh per connection, so a recorded exchange replayed later proves nothing; the
// labels differ per direction, so one side's proof cannot be reflected back as the other's; the
// context binds the connector's proof to what its hello claimed (its node id or rank), so a proof
// cannot be moved to another claim. Proofs are compared in constant time (auth/job_auth.h).
//
// Neither class does I/O or keeps a socket: each is driven by its protocol's reader and is
// single-threaded (use one from the thread or strand that reads its connection).
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace dtrain::auth {

// The two direction labels of one protocol. Protocols use their own pair, so a proof from one
// protocol's exchange is never accepted by another's.
struct HandshakeLabels {
  std::string_view acceptor;
  std::string_view connector;
};

// What the acceptor sends back to a hello.
struct Challenge {
  std::string nonce;  // Na
  std::string proof;  // P_a: the acceptor knows the secret
};

// True for what NewNonce draws: 64 lowercase hex digits. A nonce from the wire is checked with it
// before it is used.
bool IsNonce(std::string_view text);

class ConnectorHandshake {
 public:
  // `secret` must not be empty (a job without a secret runs no handshake).
  ConnectorHandshake(std::string secret, HandshakeLabels labels);

  // Nc, drawn at construction, for the hello.
  const std::string& nonce() const { return nonce_; }

  // The acceptor's challenge: nullopt if its nonce is malformed or its proof does not check (it
  // does not know the secret); else P_c, bound to `context`, to send.
  std::optional<std::string> Answer(std::string_view their_nonce, std::string_view their_proof,
                                    std::initializer_list<std::string_view> context) const;

 private:
  std::string secret_;
  HandshakeLabels labels_;
  std::string nonce_;
};

class AcceptorHandshake {
 public:
  // `secret` must not be empty.
  AcceptorHandshake(std::string secret, HandshakeLabels labels);

  // The hello's nonce: nullopt if it is malformed (no node of the job sent it), else the challenge
  // to send. A second call replaces the first challenge.
  std::optional<Challenge> OnHello(std::string_view connector_nonce);

  // Whether `proof` answers the challenge for `context` (what the hello claimed). False before
  // OnHello succeeded.
  bool Verify(std::string_view proof, std::initializer_list<std::string_view> context) const;

  bool challenged() const { return !acceptor_nonce_.empty(); }

 private:
  std::string secret_;
  HandshakeLabels labels_;
  std::string connector_nonce_;
  std::string acceptor_nonce_;
};

}  // namespace dtrain::auth

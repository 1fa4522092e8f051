// Proof that a peer knows the job's secret (DTRAIN_JOB_SECRET), without sending it.
//
// Every connection of an authenticated job runs a challenge-response before any message counts
// (transport/tcp_transport.cc, collectives/rendezvous_store.cc): each side sends a fresh random
// nonce, and each answers the other's nonce with HMAC-SHA256(secret, label, nonces, context). The
// nonces are fresh per connection, so a recorded handshake replayed later proves nothing; the
// labels differ per direction, so one side's answer cannot be reflected back as the other's. Proofs
// are compared in constant time.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dtrain::auth {

// The shortest DTRAIN_JOB_SECRET accepted (characters).
constexpr size_t kMinSecretChars = 16;

// The job secret from DTRAIN_JOB_SECRET's value (unset or empty: none, ""). Throws ConfigError if
// it is shorter than kMinSecretChars; the message never quotes the value (it may reach a shared
// log).
std::string SecretFromVariable(const std::optional<std::string>& value);

// 32 bytes from OpenSSL's CSPRNG, as 64 lowercase hex digits. Throws Error if it has no entropy.
std::string NewNonce();

// HMAC-SHA256 of `label`, then each part, each followed by a newline, keyed by `secret`; as 64
// lowercase hex digits.
std::string Proof(std::string_view secret, std::string_view label,
                  std::initializer_list<std::string_view> parts);

// Constant-time comparison of two proofs; false if their lengths differ.
bool ProofsEqual(std::string_view expected, std::string_view received);

// The value of `name=` among the space-separated words of `text` ("" if absent): how the
// handshakes carry nonces and proofs.
std::string WordValue(std::string_view text, std::string_view name);

}  // namespace dtrain::auth

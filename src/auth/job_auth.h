// Proof that a peer knows the job's secret (DTRAIN_JOB_SECRET), without sending it.
//
// The primitives of the challenge-response that every connection of an authenticated job runs
// before any message counts (auth/handshake.h, used by the TCP transport and the Gloo rendezvous
// store): fresh nonces and HMAC-SHA256 proofs, compared in constant time. The secret's own rules
// (its minimum length) are the configuration's (common/config/config.h).
#pragma once

#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace dtrain::auth {

// 32 bytes from OpenSSL's CSPRNG, as 64 lowercase hex digits. Throws Error if it has no entropy.
std::string NewNonce();

// HMAC-SHA256 of `label`, then each part, each followed by a newline, keyed by `secret`; as 64
// lowercase hex digits.
std::string Proof(std::string_view secret, std::string_view label,
                  std::span<const std::string_view> parts);
inline std::string Proof(std::string_view secret, std::string_view label,
                         std::initializer_list<std::string_view> parts) {
  return Proof(secret, label, std::span<const std::string_view>(parts.begin(), parts.size()));
}

// Constant-time comparison of two proofs; false if their lengths differ.
bool ProofsEqual(std::string_view expected, std::string_view received);

// The value of `name=` among the space-separated words of `text` ("" if absent): how the
// handshakes carry nonces and proofs.
std::string WordValue(std::string_view text, std::string_view name);

}  // namespace dtrain::auth

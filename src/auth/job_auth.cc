#include "auth/job_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>

#include "dtrain/common/error.h"

namespace dtrain::auth {
namespace {

std::string Hex(const unsigned char* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '\0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

}  // namespace

std::string NewNonce() {
  std::array<unsigned char, 32> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    throw Error("cannot draw a random nonce (OpenSSL's RAND_bytes failed)");
  }
  return Hex(bytes.data(), bytes.size());
}

std::string Proof(std::string_view secret, std::string_view label,
                  std::span<const std::string_view> parts) {
  std::string text(label);
  text += '\n';
  for (std::string_view part : parts) {
    text += part;
    text += '\n';
  }
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac.data(),
           &mac_len) == nullptr) {
    throw Error("cannot compute an HMAC-SHA256 (OpenSSL failed)");
  }
  return Hex(mac.data(), mac_len);
}

bool ProofsEqual(std::string_view expected, std::string_view received) {
  if (expected.size() != received.size() || expected.empty()) return false;
  return CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

std::string WordValue(std::string_view text, std::string_view name) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = std::min(text.find(' ', pos), text.size());
    std::string_view word = text.substr(pos, end - pos);
    if (word.size() > name.size() && word.substr(0, name.size()) == name &&
        word[name.size()] == '=') {
      return std::string(word.substr(name.size() + 1));
    }
    pos = end + 1;
  }
  return "";
}

}  // namespace dtrain::auth

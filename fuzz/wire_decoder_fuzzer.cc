// libFuzzer target for the wire codec (wire.h), the first code to touch bytes from the network.
//
// Whatever the input, DecodeHeader and DecodeMessage must either succeed or throw ProtocolError:
// no crash, no read outside the input (AddressSanitizer), no undefined behaviour (UBSan), no other
// exception. A message that decodes must encode back to exactly the input bytes, since the header
// has no field that decoding ignores. Each input is decoded under the default limits and under a
// small body limit.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dtrain/common/error.h"
#include "transport/wire.h"

namespace {

using dtrain::ProtocolError;
using namespace dtrain::transport;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_wire_decoder: %s\n", what);
  std::abort();
}

// Checks one input under one set of limits.
void DecodeOnce(const char* bytes, size_t size, const Limits& limits) {
  bool header_ok = false;
  Frame frame;
  try {
    frame = DecodeHeader(bytes, size, limits);
    header_ok = true;
  } catch (const ProtocolError&) {
  }

  try {
    const Message msg = DecodeMessage(bytes, size, limits);
    if (!header_ok) Fail("DecodeMessage accepted what DecodeHeader rejected");
    if (msg.meta.size() != frame.meta_len || msg.body.size != frame.body_len) {
      Fail("DecodeMessage and DecodeHeader disagree on the lengths");
    }
    if (msg.body.size > limits.max_body_bytes) Fail("body over the limit accepted");
    const std::string again = EncodeMessage(msg);
    if (again.size() != size || std::memcmp(again.data(), bytes, size) != 0) {
      Fail("a decoded message does not encode back to the same bytes");
    }
  } catch (const ProtocolError&) {
    // Rejected: the expected outcome for almost every input.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  DecodeOnce(bytes, size, Limits{});
  Limits small;  // the body limit check, and bodies right at it
  small.max_body_bytes = 32;
  DecodeOnce(bytes, size, small);
  return 0;
}

// libFuzzer target for the allreduce mode's negotiation (collectives/engine/negotiation.h): every
// rank decodes every other rank's round message, each cycle. Whatever the input, DecodeRound must
// return or throw ProtocolError; what decodes must encode back to the same bytes; and a table
// applying the decoded message as every rank's must return or throw ProtocolError: no crash, no
// memory error, no undefined behaviour, no other exception.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "collectives/engine/negotiation.h"
#include "dtrain/common/error.h"

namespace {

using namespace dtrain::collectives;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_negotiation_decoder: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const char> bytes(reinterpret_cast<const char*>(data), size);
  RoundMessage message;
  try {
    message = DecodeRound(bytes, 1);
  } catch (const dtrain::ProtocolError&) {
    return 0;
  }
  const std::vector<char> again = EncodeRound(message);
  if (again.size() != size || !std::equal(again.begin(), again.end(), bytes.begin())) {
    Fail("a decoded message encodes to other bytes");
  }
  // Twice: the second round finds the names of the first known (numbers, repeats, joins).
  NegotiationTable table(2);
  try {
    for (int round = 0; round < 2; ++round) table.Apply({message, message}, dtrain::Clock::now());
  } catch (const dtrain::ProtocolError&) {
  }
  return 0;
}

// libFuzzer target for the server checkpoint decoders (ps/checkpoint_file.h): a restored server
// decodes the checkpoint file it finds on disk, and a worker decodes the slot rounds its servers
// send after each checkpoint and after a restore. Whatever the input, each decoder must return or
// throw ProtocolError: no crash, no memory error, no undefined behaviour, no other exception. A
// checkpoint that decodes must survive a round trip through the writer's encoding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "dtrain/common/error.h"
#include "ps/checkpoint_file.h"

namespace {

using namespace dtrain::ps;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint_decoder: %s\n", what);
  std::abort();
}

bool SameCheckpoint(const ServerCheckpoint& a, const ServerCheckpoint& b) {
  if (a.slots.size() != b.slots.size() || a.optimizer_spec != b.optimizer_spec ||
      a.optimizer_state != b.optimizer_state) {
    return false;
  }
  for (size_t i = 0; i < a.slots.size(); ++i) {
    const CheckpointSlot& x = a.slots[i];
    const CheckpointSlot& y = b.slots[i];
    if (x.key != y.key || x.part != y.part || x.dtype != y.dtype || x.length != y.length ||
        x.sync != y.sync || x.rounds != y.rounds || x.row_length != y.row_length ||
        x.value.size != y.value.size ||
        std::memcmp(x.value.data, y.value.data, x.value.size) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const ServerCheckpoint c = DecodeCheckpoint(bytes);
    // Small ones only: the round trip writes a file.
    if (size < 4096) {
      static const std::string folder = (std::filesystem::temp_directory_path() /
                                         ("fuzz-checkpoint-" + std::to_string(::getpid())))
                                            .string();
      WriteCheckpoint(folder, c);
      const auto again = ReadCheckpoint(folder);
      if (!again || !SameCheckpoint(c, *again)) Fail("a decoded checkpoint did not round-trip");
    }
  } catch (const dtrain::ProtocolError&) {
  }
  try {
    std::string cmd;
    uint64_t checkpoint = 0, checkpoint_again = 0;
    const auto slots = DecodeSlotRounds(bytes, &cmd, &checkpoint);
    const auto again =
        DecodeSlotRounds(EncodeSlotRounds(cmd, slots, checkpoint), nullptr, &checkpoint_again);
    if (again.size() != slots.size()) Fail("slot rounds did not round-trip");
    if (checkpoint_again != checkpoint) Fail("a checkpoint number did not round-trip");
  } catch (const dtrain::ProtocolError&) {
  }
  return 0;
}

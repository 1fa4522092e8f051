// A server's checkpoint: its slots (values, completed dist_sync rounds or each worker's dist_async
// pushes) and its optimizer (the
// spec and the state), in one file per server rank that is only ever replaced whole.
//
// File DIR/server-<rank>/checkpoint.dtsc (all integers little-endian):
//   "DTSC" u32 version(1) u64 index_bytes  index (JSON)  values  optimizer state  "DTSE" u64 size
// where index = {"slots": [{"key", "part", "dtype", "length", "sync", "rounds"[, "pushes"]
// [, "row_length"]}...],
// "optimizer": spec JSON or "", "optimizer_state_bytes": n}, the values are the slots' bytes back
// to back in index order, and size is the whole file's. Written to a temporary name in the same
// folder, flushed to disk (fsync) and renamed over the old one, so a reader sees the previous
// checkpoint or the new one, never a part; a file that does not add up (size, end marker, index)
// is refused as corrupt. A checkpoint needs as much disk as the server's share of the values plus
// the optimizer's state for them (none for SGD without momentum, one value's worth for momentum,
// two for Adam), and twice that while the next one is written.
//
// Threads: the functions are independent; callers serialise writes to one folder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/common/dtype.h"
#include "transport/message.h"

namespace dtrain::ps {

struct CheckpointSlot {
  uint64_t key = 0;
  uint32_t part = 0;
  DType dtype = DType::kFloat32;
  int64_t length = 0;
  bool sync = true;
  int64_t rounds = 0;  // dist_sync rounds applied to value
  // dist_async: the pushes applied to value, per worker rank (empty for dist_sync). A restored
  // server counts from them; each worker repeats its pushes since (issue 63).
  std::vector<int64_t> pushes;
  transport::Body value;   // length elements of dtype
  int64_t row_length = 0;  // a matrix's slot: elements per row (row-sparse requests); else 0

  // What worker `worker` has pushed into value: the rounds, or its asynchronous pushes.
  int64_t PushedBy(int worker) const {
    if (sync) return rounds;
    return worker >= 0 && static_cast<size_t>(worker) < pushes.size() ? pushes[worker] : 0;
  }
};

struct ServerCheckpoint {
  std::vector<CheckpointSlot> slots;
  std::string optimizer_spec;   // OptimizerSpec::ToJson(), "" when none is set
  std::string optimizer_state;  // Optimizer::SaveState()
};

// DIR/server-<rank>: where server `rank` keeps its checkpoint.
std::string CheckpointFolder(const std::string& dir, int rank);

// Writes `checkpoint` into `folder` (made if missing), replacing the previous one atomically.
// Returns the file's size. Throws Error naming the path when the disk refuses.
size_t WriteCheckpoint(const std::string& folder, const ServerCheckpoint& checkpoint);

// The folder's checkpoint, or nullopt if it has none. Throws Error if it is corrupt or unreadable.
std::optional<ServerCheckpoint> ReadCheckpoint(const std::string& folder);

// Removes the folder's checkpoint and any half-written one (a new job in an old folder).
void RemoveCheckpoint(const std::string& folder);

// The file's bytes, parsed and checked. Throws ProtocolError saying what does not fit.
ServerCheckpoint DecodeCheckpoint(std::string_view bytes);

// A slot's completed rounds, as servers tell workers after a checkpoint and a restored server
// tells them where it resumes: {"cmd": ..., "slots": [[key, part, rounds]...]}, and after a
// checkpoint its number ({"checkpoint": n}, counted from 1 by each server).
struct SlotRounds {
  uint64_t key = 0;
  uint32_t part = 0;
  int64_t rounds = 0;
};
std::string EncodeSlotRounds(const std::string& cmd, const std::vector<SlotRounds>& slots,
                             uint64_t checkpoint = 0);
// Throws ProtocolError unless `meta` is such a message; returns its slots, its cmd in *cmd and its
// checkpoint number (0 if none) in *checkpoint.
std::vector<SlotRounds> DecodeSlotRounds(std::string_view meta, std::string* cmd = nullptr,
                                         uint64_t* checkpoint = nullptr);

}  // namespace dtrain::ps

// Server::SlotState: what a server keeps per slot (server.h has the model), shared by the files
// that implement Server (server.cc: rounds; server_checkpointing.cc: checkpoints).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/common/dtype.h"
#include "ps/server.h"
#include "transport/message.h"

namespace dtrain::ps {

struct Server::SlotState {
  // A slot of `workers` ranks whose value has had `rounds` dist_sync rounds applied (a restored
  // checkpoint's; 0 for a new key): every rank has contributed to each of them.
  SlotState(uint64_t key, uint32_t part, int64_t length, DType dtype, bool sync,
            transport::Body value, int workers, int64_t rounds)
      : key(key),
        part(part),
        length(length),
        dtype(dtype),
        sync(sync),
        value(std::move(value)),
        pushed(workers, 0),
        deferred(workers),
        contributed(workers, rounds),
        absorb(workers, 0),
        resume_at(workers, -1),
        skip(workers, 0),
        rounds(rounds) {}

  std::mutex mutex;
  uint64_t key = 0;
  uint32_t part = 0;
  int64_t length = 0;
  DType dtype = DType::kFloat32;
  bool sync = true;
  transport::Body value;  // current value: weights, or the last merged sum

  // dist_sync round state.
  transport::Body merged;
  int pushed_count = 0;
  std::vector<char> pushed;                // per worker rank
  std::vector<transport::Header> waiting;  // requests answered when the round completes
  std::vector<std::deque<transport::Message>>
      deferred;  // per worker: messages held for later rounds
  // Per worker rank: pushes summed into rounds, and (a replacement's) pushes of rounds its lost
  // process had already pushed into, still to come (absorbed, not summed).
  std::vector<int64_t> contributed;
  std::vector<int64_t> absorb;
  // Per worker rank: where a replacement resumes when this slot has fewer of its rank's rounds
  // (this server restored a checkpoint from before the lost process's pushes; -1: no such
  // replacement), and the rounds that complete without its push (server.h).
  std::vector<int64_t> resume_at;
  std::vector<int64_t> skip;
  int64_t rounds = 0;  // dist_sync rounds applied to value

  // A matrix's slot (init's "row_length"; 0 for other values): row-sparse requests
  // (server_rows.cc). A dist_sync round of row pushes sums them into `row_sums` (as long as the
  // slot, allocated zeroed by the first and kept zero outside the rows pushed since), each row
  // pushed listed once in `touched` and marked in `row_touched`; the rows of a waiting row pull.
  int64_t row_length = 0;
  bool rows_round = false;  // the round so far holds row pushes only
  transport::Body row_sums;
  std::vector<int64_t> touched;
  std::vector<char> row_touched;
  std::vector<std::pair<transport::Header, std::vector<int64_t>>> waiting_rows;
  // Without an optimizer a round's sum becomes the value: after a row round, the value is zero
  // but in `value_rows` (value_holds_rows), so the next row round clears just those.
  bool value_holds_rows = false;
  std::vector<int64_t> value_rows;

  size_t bytes() const { return static_cast<size_t>(length) * DTypeSize(dtype); }
  int64_t rows() const { return row_length > 0 ? length / row_length : 0; }
  size_t row_bytes() const { return static_cast<size_t>(row_length) * DTypeSize(dtype); }
  uint64_t optimizer_index() const { return (key << 20) | part; }
};

// A body of `bytes` from the process's BufferPool (uninitialised).
transport::Body NewBuffer(size_t bytes);

// Requests that add to a slot's value, and those that read it.
inline bool IsPushCommand(transport::Command c) {
  return c == transport::Command::kPush || c == transport::Command::kPushPull ||
         c == transport::Command::kPushRows;
}
inline bool IsPullCommand(transport::Command c) {
  return c == transport::Command::kPull || c == transport::Command::kPullRows;
}
// Pushes answered with an empty acknowledgement (a pushpull's answer is the value).
inline bool AcknowledgedOnly(transport::Command c) {
  return c == transport::Command::kPush || c == transport::Command::kPushRows;
}

// "key K" or "key K part P", as errors and logs name a slot.
inline std::string SlotName(uint64_t key, uint32_t part) {
  return "key " + std::to_string(key) + (part ? " part " + std::to_string(part) : "");
}

}  // namespace dtrain::ps

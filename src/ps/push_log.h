// PushLog: what a worker keeps of its dist_sync pushes since its servers' last checkpoints, so
// that it can push them again to a server restored from its checkpoint (server.h).
//
// Each slot (key, part) counts the rounds this worker has pushed into it; a push is kept with its
// round until the slot's server says a checkpoint holds that round (Trim). The log is bounded:
// when a server's share passes half of the bound, the caller is told to ask that server for a
// checkpoint (it answers with a Trim); past the whole bound the oldest pushes of the slot being
// pushed go, and a restore that needs them fails, naming the rounds missing.
//
// Threads: none of its own; the caller serialises every call (WorkerClient's mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "transport/message.h"

namespace dtrain::ps {

class PushLog {
 public:
  struct Entry {
    int64_t round = 0;
    uint64_t request_id = 0;
    transport::Message push;  // its body owned (a copy, never the caller's array)
  };
  struct Recorded {
    int64_t round = 0;
    bool ask_for_checkpoint = false;  // this server's share passed half of the bound
    uint64_t heard_checkpoint = 0;    // the server's last checkpoint this worker heard of
  };
  using SlotId = std::pair<uint64_t, uint32_t>;

  PushLog(size_t bound_bytes, int num_servers);

  // Keeps `push` (to `server`, slot push.header.key/part) as the slot's next round.
  Recorded Record(int server, uint64_t request_id, const transport::Message& push);
  // A replacement worker: the slot's rounds so far (its lost process pushed them).
  void StartAt(SlotId slot, int64_t rounds);
  // `server` checkpointed these slots at these rounds: their pushes up to them go.
  void Trim(int server, SlotId slot, int64_t rounds);
  // The server's checkpoint number `checkpoint` came (with its Trims): it may be asked again.
  void CheckpointAnswered(int server, uint64_t checkpoint);
  // The pushes to `server` after the rounds it restored (slots missing from `restored`: after
  // round 0), in the order they were sent. Throws PeerError if the bound dropped some of them.
  std::vector<Entry> Since(int server, const std::map<SlotId, int64_t>& restored) const;
  // The round of slot's pushes so far.
  int64_t pushed(SlotId slot) const;

  size_t bytes() const { return total_; }

 private:
  struct SlotLog {
    int server = 0;
    int64_t pushed = 0;           // rounds this worker pushed into the slot
    int64_t dropped_through = 0;  // rounds the bound dropped (they cannot be repeated)
    std::deque<Entry> entries;
  };
  void Drop(SlotLog& log);

  const size_t bound_;
  std::map<SlotId, SlotLog> slots_;
  std::vector<size_t> server_bytes_;
  std::vector<char> asked_;
  std::vector<uint64_t> heard_;  // by server: its last checkpoint's number
  size_t total_ = 0;
};

}  // namespace dtrain::ps

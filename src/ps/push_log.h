// PushLog: what a worker keeps of its pushes since its servers' last checkpoints, so that it can
// push them again to a server restored from its checkpoint (server.h).
//
// Each slot (key, part) counts the rounds this worker has pushed into it (dist_async: its pushes,
// which the server counts per worker the same way); a push is kept with its
// round until the slot's server says a checkpoint holds that round (Trim). The log is bounded:
// when a server's share passes half of the bound, the caller is told to ask that server for a
// checkpoint (it answers with a Trim); past the whole bound the oldest pushes of the slot being
// pushed go, and a restore that needs them fails, naming the rounds missing.
//
// The bound by default (DTRAIN_REPLAY_LOG_MB unset) is 64 rounds of this worker's pushes, at least
// 256 MB and at most 512 MB: servers then checkpoint every 32 rounds or so of a big model. The
// floor is for small, fast models: each checkpoint costs the servers a pause, a capture of the
// optimizer's state and a notice to every worker, and a LeNet with a 64 MB floor checkpointed
// every 80 rounds (46 times in a 10 s run on one server; 15 with 256 MB, docs/performance.md).
// The memory is faulted in when the worker starts (DistKVStore reserves the first fill), so its
// steps do not pay for fresh pages. A fixed bound either makes big models checkpoint every round
// or small ones hold more than they need.
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

  static constexpr size_t kAutoRounds = 64;
  static constexpr size_t kAutoMinBytes = size_t{256} << 20;
  static constexpr size_t kAutoMaxBytes = size_t{512} << 20;

  // bound_bytes: 0 for the default (kAutoRounds rounds, within kAutoMinBytes..kAutoMaxBytes).
  PushLog(size_t bound_bytes, int num_servers);

  // Keeps `push` (to `server`, slot push.header.key/part) as the slot's next round.
  Recorded Record(int server, uint64_t request_id, const transport::Message& push);
  // A replacement worker: the slot's rounds so far (its lost process pushed them to `server`,
  // which holds the slot: a restore of that server, not another's, checks and repeats them).
  void StartAt(int server, SlotId slot, int64_t rounds);
  // `server` checkpointed these slots at these rounds: their pushes up to them go.
  void Trim(int server, SlotId slot, int64_t rounds);
  // The server's checkpoint number `checkpoint` came (with its Trims): it may be asked again.
  void CheckpointAnswered(int server, uint64_t checkpoint);
  // The pushes to `server` after the rounds it restored (slots missing from `restored`: after
  // round 0), in the order they were sent. Throws PeerError if the bound dropped some of them.
  std::vector<Entry> Since(int server, const std::map<SlotId, int64_t>& restored) const;
  // The round of slot's pushes so far.
  int64_t pushed(SlotId slot) const;
  // Whether this process has recorded a push to `server` (a replacement: since it rejoined).
  bool RecordedFor(int server) const { return recorded_[server] != 0; }

  size_t bytes() const { return total_; }
  size_t bound() const;

 private:
  struct SlotLog {
    int server = 0;
    int64_t pushed = 0;           // rounds this worker pushed into the slot
    int64_t dropped_through = 0;  // rounds the bound dropped (they cannot be repeated)
    size_t push_bytes = 0;        // its latest push's
    std::deque<Entry> entries;
  };
  void Drop(SlotLog& log);

  const size_t fixed_bound_;  // 0: the default
  size_t round_bytes_ = 0;    // a round of this worker's pushes: every slot's latest, summed
  std::map<SlotId, SlotLog> slots_;
  std::vector<size_t> server_bytes_;
  std::vector<char> asked_;
  std::vector<char> recorded_;   // per server: a push recorded
  std::vector<uint64_t> heard_;  // by server: its last checkpoint's number
  size_t total_ = 0;
};

}  // namespace dtrain::ps

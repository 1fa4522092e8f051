// How the ranks agree, each cycle, which named collectives every rank has submitted.
//
// Every cycle each rank sends one RoundMessage (the names it submitted since the last cycle) and
// receives everyone's (one allgather; engine.cc). Every rank feeds the same messages, in rank
// order, to its own NegotiationTable, so every table makes the same decisions without a
// coordinator: which collectives are ready (submitted by all), in which order they run, and which
// ranks disagree about one. This saves the second message of Horovod's
// gather-to-rank-0-then-broadcast.
//
// Names repeat every training step, so the table gives each name a number the first time it is
// announced (numbering is deterministic: message order). A rank that submits a name again with the
// same descriptor as its last time sends only the number: 4 bytes instead of ~50.
//
// Single-threaded: the engine's background thread owns the table.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/engine/autotune.h"
#include "dtrain/collectives/collectives.h"
#include "dtrain/common/array.h"
#include "dtrain/common/deadline.h"

namespace dtrain::collectives {

enum class OpKind : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kAlltoall = 4,
  kReducescatter = 5,
  // A name submitted again while this rank's earlier collective of that name was in flight:
  // refused at submission, and announced once the earlier one is done so that every rank's
  // collective of the name fails with the refusal (engine.cc), whatever the timing.
  kRefused = 6,
};

const char* OpKindName(OpKind kind);
const char* ReduceOpName(ReduceOp op);  // "sum", "average", ..., "adasum"

// What one rank submitted under a name. Ranks must agree on all of it (SameWork), except that
// allgather and alltoall inputs may differ in their first dimension (and alltoall's splits), and
// the priority, a scheduling hint: rank 0's decides.
struct Descriptor {
  OpKind kind = OpKind::kAllreduce;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // allreduce and reducescatter
  int32_t root = 0;              // broadcast only
  Shape shape;
  int32_t priority = 0;  // allreduce only: among those ready, the highest runs first
  // The arrays are CUDA device memory, moved over NCCL (nccl/device_communicator.h). Ranks must
  // agree: one NCCL collective cannot meet a host one.
  bool on_device = false;
  // alltoall only: how many rows (entries of the first dimension) go to each rank, in rank order;
  // one per rank, summing to shape[0]. Every rank learns every rank's, so each knows what it
  // receives without a second exchange.
  std::vector<int64_t> splits;

  bool operator==(const Descriptor&) const = default;
  // Everything but the priority.
  bool SameWork(const Descriptor& other) const;
  std::string ToString() const;  // "allreduce(average) float32 (4,3)"
};

// Horovod's reducescatter layout: of `rows` (the first dimension), rank r keeps a contiguous run,
// as even as can be, the lower ranks one more when they do not divide: (first row, count).
std::pair<int64_t, int64_t> ReducescatterRows(int64_t rows, int size, int rank);

// Whether an alltoall's splits give every rank a count of rows and add up to its first dimension.
bool SplitsFit(const Descriptor& d, int size);

constexpr size_t kMaxNameLength = 1024;
constexpr size_t kMaxDimensions = 32;

// One rank's part of a negotiation round.
struct RoundMessage {
  bool shutting_down = false;
  bool joined = false;  // this rank called Join this round (it has no more data)
  // This rank's vote for a deadlock: a thread here waits for one of its collectives that some
  // rank has not submitted, and nothing was submitted or run for the grace time (engine.cc).
  // When every rank votes in the same round, every table sees it, and every rank fails its
  // pending collectives alike.
  bool stuck = false;
  std::vector<std::pair<std::string, Descriptor>> named;  // announced in full
  std::vector<uint32_t> numbered;  // announced by number: same descriptor as this rank's last time
  // Rank 0 only, under autotune (autotune.h): every rank uses these values from this round on.
  std::optional<TunedParameters> tuned;

  bool empty() const { return named.empty() && numbered.empty(); }
};

std::vector<char> EncodeRound(const RoundMessage& message);
// Throws ProtocolError naming `rank` for bytes that do not decode.
RoundMessage DecodeRound(std::span<const char> bytes, int rank);

// A collective that every rank has submitted, or stands in for by having joined.
struct ReadyCollective {
  std::string name;
  std::vector<Descriptor> descriptors;  // one per rank
  std::string mismatch;                 // non-empty: the ranks disagree, and this says how
  // Per rank: 1 if the rank had joined and takes part with zeros instead of a tensor of its own
  // (allreduce only; other kinds fail with `mismatch` while a rank has joined).
  std::vector<char> joined;
};

// A collective that some ranks submitted and others have not, for the stall warning.
struct PendingCollective {
  std::string name;
  std::vector<int> missing_ranks;
  Duration waiting{0};
};

class NegotiationTable {
 public:
  explicit NegotiationTable(int size);

  // Adds `rank`'s announcement of a newly submitted collective to `message`.
  void Announce(int rank, const std::string& name, const Descriptor& descriptor,
                RoundMessage* message) const;

  // Applies one round (round[r] is rank r's message). Returns the collectives that became ready,
  // in the order they were first announced. Throws ProtocolError for an unknown number or a name
  // a rank announced twice.
  std::vector<ReadyCollective> Apply(const std::vector<RoundMessage>& round, Clock::time_point now);

  // Once every rank has joined (Horovod's join: a rank out of data), the rank that joined last
  // (the highest of the last round's), and the joins start afresh; nullopt until then.
  std::optional<int> TakeJoinCompleted();

  // Collectives waiting for some ranks since before now - `older_than`, oldest first.
  std::vector<PendingCollective> Waiting(Clock::time_point now, Duration older_than) const;
  // Forgets every pending collective (a deadlock: the ranks fail theirs), returning them with
  // their missing ranks, oldest first. Every rank calls it in the same round, so the tables stay
  // the same: a later collective of one of these names starts afresh on every rank.
  std::vector<PendingCollective> DropPending(Clock::time_point now);
  // The ranks that have not yet submitted `name`; empty when it is not pending.
  std::vector<int> MissingRanks(const std::string& name) const;
  size_t pending() const { return pending_.size(); }
  // Whether some pending collective still lacks `rank`'s submission (the rank is late for it).
  bool Lacks(int rank) const;
  // Whether `rank` has joined in the current round of joins (not yet completed by every rank).
  bool HasJoined(int rank) const { return has_joined_[rank] != 0; }

 private:
  struct Name {
    std::string name;
    std::vector<std::optional<Descriptor>> last;  // per rank: what it announced last time
  };
  struct Pending {
    std::vector<std::optional<Descriptor>> submitted;  // per rank
    std::vector<char> joined;                          // per rank: stood in for by a join
    int count = 0;
    Clock::time_point since;
  };

  void Submit(int rank, uint32_t id, const Descriptor& descriptor, Clock::time_point now);
  // Joined ranks stand in for every pending collective they have not submitted.
  void FillForJoined();
  std::string Mismatch(const std::string& name, const std::vector<Descriptor>& d) const;

  int size_;
  std::vector<Name> names_;  // index = number
  std::unordered_map<std::string, uint32_t> numbers_;
  // Keyed by (sequence of first announcement, number): iteration order is announcement order.
  std::map<std::pair<uint64_t, uint32_t>, Pending> pending_;
  std::unordered_map<uint32_t, uint64_t> pending_sequence_;  // number -> its key in pending_
  uint64_t next_sequence_ = 0;
  std::vector<char> has_joined_;  // per rank, until every rank has
  int num_joined_ = 0;
  std::optional<int> join_completed_;
};

}  // namespace dtrain::collectives

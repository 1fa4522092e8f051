#include "collectives/engine/negotiation.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "collectives/byte_codec.h"
#include "common/dtype_checks.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

// 2: a priority after each descriptor's shape; 3: on_device; 4: alltoall splits, and the kinds
// and ops of Horovod's whole API.
constexpr uint8_t kVersion = 6;  // 6: autotune's values (kTuned)
constexpr uint8_t kShuttingDown = 1;
constexpr uint8_t kJoined = 2;
constexpr uint8_t kStuck = 4;
constexpr uint8_t kTuned = 8;
// Bounds of tuned values a rank accepts (HOROVOD_FUSION_THRESHOLD's and HOROVOD_CYCLE_TIME's).
constexpr int64_t kMaxTunedThreshold = int64_t{1} << 36;
constexpr int64_t kMaxTunedCycleMicros = int64_t{60000} * 1000;
// The smallest encodings, to bound counts read off the wire before allocating for them.
constexpr size_t kMinNamedBytes = 2 + 1 + 1 + 1 + 1 + 4 + 1 + 4 + 1 + 4;
constexpr size_t kNumberBytes = 4;

bool SameExceptFirstDimension(const Descriptor& a, const Descriptor& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.on_device == b.on_device &&
         a.shape.size() == b.shape.size() && !a.shape.empty() &&
         std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1);
}

}  // namespace

std::pair<int64_t, int64_t> ReducescatterRows(int64_t rows, int size, int rank) {
  const int64_t share = rows / size;
  const int64_t extra = rows % size;
  return {rank * share + std::min<int64_t>(rank, extra), share + (rank < extra ? 1 : 0)};
}

bool SplitsFit(const Descriptor& d, int size) {
  if (d.shape.empty() || d.splits.size() != static_cast<size_t>(size)) return false;
  int64_t rows = 0;
  for (int64_t s : d.splits) {
    if (s < 0 || s > d.shape[0] - rows) return false;
    rows += s;
  }
  return rows == d.shape[0];
}

bool Descriptor::SameWork(const Descriptor& other) const {
  return kind == other.kind && dtype == other.dtype && op == other.op && root == other.root &&
         shape == other.shape && on_device == other.on_device && splits == other.splits;
}

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kAlltoall:
      return "alltoall";
    case OpKind::kReducescatter:
      return "reducescatter";
    case OpKind::kRefused:
      return "refused";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
    case ReduceOp::kAdasum:
      return "adasum";
  }
  return "unknown";
}

std::string Descriptor::ToString() const {
  if (kind == OpKind::kRefused) return "submitted again while its earlier one was in flight";
  std::ostringstream out;
  out << OpKindName(kind);
  if (kind == OpKind::kAllreduce || kind == OpKind::kReducescatter) {
    out << "(" << ReduceOpName(op) << ")";
  }
  if (kind == OpKind::kBroadcast) out << "(root " << root << ")";
  if (kind != OpKind::kBarrier) out << " " << DTypeName(dtype) << " " << ShapeToString(shape);
  if (kind == OpKind::kAlltoall) out << " splits " << ShapeToString(splits);
  if (on_device) out << " on the GPU";
  return out.str();
}

std::vector<char> EncodeRound(const RoundMessage& message) {
  ByteWriter out;
  out.U8(kVersion);
  out.U8((message.shutting_down ? kShuttingDown : 0) | (message.joined ? kJoined : 0) |
         (message.stuck ? kStuck : 0) | (message.tuned ? kTuned : 0));
  out.U32(static_cast<uint32_t>(message.named.size()));
  for (const auto& [name, d] : message.named) {
    out.U16(static_cast<uint16_t>(name.size()));
    out.Raw(name.data(), name.size());
    out.U8(static_cast<uint8_t>(d.kind));
    out.U8(static_cast<uint8_t>(d.dtype));
    out.U8(static_cast<uint8_t>(d.op));
    out.I32(d.root);
    out.U8(static_cast<uint8_t>(d.shape.size()));
    for (int64_t dim : d.shape) out.I64(dim);
    out.I32(d.priority);
    out.U8(d.on_device ? 1 : 0);
    out.U32(static_cast<uint32_t>(d.splits.size()));
    for (int64_t rows : d.splits) out.I64(rows);
  }
  out.U32(static_cast<uint32_t>(message.numbered.size()));
  for (uint32_t number : message.numbered) out.U32(number);
  if (message.tuned) {
    out.I64(static_cast<int64_t>(message.tuned->fusion_threshold_bytes));
    out.I64(message.tuned->cycle_time.count());
  }
  return std::move(out.bytes());
}

RoundMessage DecodeRound(std::span<const char> bytes, int rank) {
  ByteReader in(bytes, "negotiation message from rank " + std::to_string(rank));
  RoundMessage m;
  const uint8_t version = in.U8("version");
  if (version != kVersion) {
    in.Fail("version", std::to_string(version) + " (this build speaks " + std::to_string(kVersion) +
                           "; are all ranks the same dtrain?)");
  }
  const uint8_t flags = in.U8("flags");
  if ((flags & ~(kShuttingDown | kJoined | kStuck | kTuned)) != 0) {
    in.Fail("flags", std::to_string(flags));
  }
  m.shutting_down = (flags & kShuttingDown) != 0;
  m.joined = (flags & kJoined) != 0;
  m.stuck = (flags & kStuck) != 0;
  const uint32_t named = in.U32("named count");
  if (named > in.left() / kMinNamedBytes) in.Fail("named count", std::to_string(named));
  m.named.reserve(named);
  for (uint32_t i = 0; i < named; ++i) {
    const uint16_t length = in.U16("name length");
    if (length == 0 || length > kMaxNameLength) in.Fail("name length", std::to_string(length));
    std::string name = in.Chars("name", length);
    Descriptor d;
    const uint8_t kind = in.U8("kind");
    if (kind > static_cast<uint8_t>(OpKind::kRefused)) in.Fail("kind", std::to_string(kind));
    d.kind = static_cast<OpKind>(kind);
    const uint8_t dtype = in.U8("dtype");
    if (!IsValidDType(dtype)) in.Fail("dtype", std::to_string(dtype));
    d.dtype = static_cast<DType>(dtype);
    const uint8_t op = in.U8("op");
    if (op > static_cast<uint8_t>(ReduceOp::kAdasum)) in.Fail("op", std::to_string(op));
    d.op = static_cast<ReduceOp>(op);
    d.root = in.I32("root");
    const uint8_t dims = in.U8("dimensions");
    if (dims > kMaxDimensions) in.Fail("dimensions", std::to_string(dims));
    d.shape.resize(dims);
    for (auto& dim : d.shape) {
      dim = in.I64("dimension");
      if (dim < 0) in.Fail("dimension", std::to_string(dim));
    }
    d.priority = in.I32("priority");
    const uint8_t place = in.U8("place");
    if (place > 1) in.Fail("place", std::to_string(place));
    d.on_device = place == 1;
    const uint32_t splits = in.U32("split count");
    if (splits > in.left() / 8) in.Fail("split count", std::to_string(splits));
    d.splits.resize(splits);
    for (auto& rows : d.splits) {
      rows = in.I64("split");
      if (rows < 0) in.Fail("split", std::to_string(rows));
    }
    m.named.emplace_back(std::move(name), std::move(d));
  }
  const uint32_t numbered = in.U32("numbered count");
  if (numbered > in.left() / kNumberBytes) in.Fail("numbered count", std::to_string(numbered));
  m.numbered.resize(numbered);
  for (auto& number : m.numbered) number = in.U32("number");
  if ((flags & kTuned) != 0) {
    const int64_t threshold = in.I64("tuned fusion threshold");
    if (threshold < 0 || threshold > kMaxTunedThreshold) {
      in.Fail("tuned fusion threshold", std::to_string(threshold));
    }
    const int64_t cycle = in.I64("tuned cycle time");
    if (cycle < 0 || cycle > kMaxTunedCycleMicros)
      in.Fail("tuned cycle time", std::to_string(cycle));
    m.tuned = TunedParameters{static_cast<size_t>(threshold), std::chrono::microseconds(cycle)};
  }
  in.ExpectEnd();
  return m;
}

NegotiationTable::NegotiationTable(int size) : size_(size), has_joined_(size, 0) {}

void NegotiationTable::Announce(int rank, const std::string& name, const Descriptor& descriptor,
                                RoundMessage* message) const {
  auto it = numbers_.find(name);
  if (it != numbers_.end() && names_[it->second].last[rank] == descriptor) {
    message->numbered.push_back(it->second);
  } else {
    message->named.emplace_back(name, descriptor);
  }
}

std::vector<ReadyCollective> NegotiationTable::Apply(const std::vector<RoundMessage>& round,
                                                     Clock::time_point now) {
  for (int r = 0; r < size_; ++r) {
    for (const auto& [name, d] : round[r].named) {
      if (d.kind == OpKind::kBroadcast && (d.root < 0 || d.root >= size_)) {
        throw ProtocolError("rank " + std::to_string(r) + " announced broadcast '" + name +
                            "' from root " + std::to_string(d.root) + ", not a rank");
      }
      if (d.kind == OpKind::kAlltoall && !SplitsFit(d, size_)) {
        throw ProtocolError("rank " + std::to_string(r) + " announced alltoall '" + name +
                            "' with splits " + ShapeToString(d.splits) + " that do not divide " +
                            ShapeToString(d.shape) + " among " + std::to_string(size_) + " ranks");
      }
      auto [it, added] = numbers_.emplace(name, static_cast<uint32_t>(names_.size()));
      if (added) names_.push_back({name, std::vector<std::optional<Descriptor>>(size_)});
      names_[it->second].last[r] = d;
      Submit(r, it->second, d, now);
    }
    for (uint32_t number : round[r].numbered) {
      if (number >= names_.size() || !names_[number].last[r]) {
        throw ProtocolError("rank " + std::to_string(r) + " announced collective number " +
                            std::to_string(number) + ", which it never named");
      }
      Submit(r, number, *names_[number].last[r], now);
    }
  }
  int last_joined = -1;
  for (int r = 0; r < size_; ++r) {
    if (!round[r].joined) continue;
    if (has_joined_[r]) {
      throw ProtocolError("rank " + std::to_string(r) + " joined twice in one join");
    }
    has_joined_[r] = 1;
    ++num_joined_;
    last_joined = r;
  }
  if (num_joined_ > 0) FillForJoined();
  if (num_joined_ == size_) {
    join_completed_ = last_joined;
    std::fill(has_joined_.begin(), has_joined_.end(), 0);
    num_joined_ = 0;
  }
  std::vector<ReadyCollective> ready;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.count < size_) {
      ++it;
      continue;
    }
    ReadyCollective c;
    c.name = names_[it->first.second].name;
    for (auto& d : it->second.submitted) c.descriptors.push_back(std::move(*d));
    c.joined = std::move(it->second.joined);
    c.mismatch = Mismatch(c.name, c.descriptors);
    const bool stood_in = std::find(c.joined.begin(), c.joined.end(), 1) != c.joined.end();
    if (c.mismatch.empty() && stood_in && c.descriptors[0].kind != OpKind::kAllreduce) {
      c.mismatch = "collective '" + c.name + "' (" + c.descriptors[0].ToString() +
                   ") cannot run while some ranks have joined: only allreduces go on until "
                   "every rank has joined";
    }
    ready.push_back(std::move(c));
    pending_sequence_.erase(it->first.second);
    it = pending_.erase(it);
  }
  return ready;
}

void NegotiationTable::Submit(int rank, uint32_t number, const Descriptor& descriptor,
                              Clock::time_point now) {
  auto [seq, added] = pending_sequence_.emplace(number, next_sequence_);
  if (added) ++next_sequence_;
  Pending& p = pending_[{seq->second, number}];
  if (added) {
    p.submitted.resize(size_);
    p.joined.assign(size_, 0);
    p.since = now;
  }
  if (p.submitted[rank]) {
    throw ProtocolError("rank " + std::to_string(rank) + " announced '" + names_[number].name +
                        "' twice while it was in flight");
  }
  p.submitted[rank] = descriptor;
  ++p.count;
}

void NegotiationTable::FillForJoined() {
  for (auto& [key, p] : pending_) {
    const auto first = std::find_if(p.submitted.begin(), p.submitted.end(),
                                    [](const auto& d) { return d.has_value(); });
    if (first == p.submitted.end()) continue;
    const Descriptor model = **first;
    for (int r = 0; r < size_; ++r) {
      if (!has_joined_[r] || p.submitted[r]) continue;
      p.submitted[r] = model;
      p.joined[r] = 1;
      ++p.count;
    }
  }
}

std::optional<int> NegotiationTable::TakeJoinCompleted() {
  return std::exchange(join_completed_, std::nullopt);
}

std::string NegotiationTable::Mismatch(const std::string& name,
                                       const std::vector<Descriptor>& d) const {
  const bool first_may_differ = d[0].kind == OpKind::kAllgather || d[0].kind == OpKind::kAlltoall;
  bool agree = true;
  for (int r = 1; r < size_ && agree; ++r) {
    agree = first_may_differ ? SameExceptFirstDimension(d[0], d[r]) : d[0].SameWork(d[r]);
  }
  if (agree) return {};
  std::ostringstream out;
  out << "collective '" << name << "' was submitted differently by the ranks:";
  for (int r = 0; r < size_; ++r) out << (r ? "," : "") << " rank " << r << " " << d[r].ToString();
  if (first_may_differ) {
    out << " (" << OpKindName(d[0].kind) << " inputs may differ only in dimension 0)";
  }
  return out.str();
}

std::vector<PendingCollective> NegotiationTable::Waiting(Clock::time_point now,
                                                         Duration older_than) const {
  std::vector<PendingCollective> out;
  for (const auto& [key, p] : pending_) {
    if (now - p.since < older_than) continue;
    PendingCollective c;
    c.name = names_[key.second].name;
    for (int r = 0; r < size_; ++r) {
      if (!p.submitted[r]) c.missing_ranks.push_back(r);
    }
    c.waiting = std::chrono::duration_cast<Duration>(now - p.since);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<PendingCollective> NegotiationTable::DropPending(Clock::time_point now) {
  std::vector<PendingCollective> dropped = Waiting(now, Duration(0));
  pending_.clear();
  pending_sequence_.clear();
  return dropped;
}

std::vector<int> NegotiationTable::MissingRanks(const std::string& name) const {
  auto number = numbers_.find(name);
  if (number == numbers_.end()) return {};
  auto seq = pending_sequence_.find(number->second);
  if (seq == pending_sequence_.end()) return {};
  const Pending& p = pending_.at({seq->second, number->second});
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (!p.submitted[r]) missing.push_back(r);
  }
  return missing;
}

bool NegotiationTable::Lacks(int rank) const {
  return std::any_of(pending_.begin(), pending_.end(),
                     [&](const auto& entry) { return !entry.second.submitted[rank]; });
}

}  // namespace dtrain::collectives

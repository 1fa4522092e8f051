// The negotiation protocol in one process: N tables fed the same rounds, as N ranks would be.
#include "collectives/engine/negotiation.h"

#include <gtest/gtest.h>

#include <optional>

#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

Descriptor Reduce(Shape shape, DType dtype = DType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Descriptor d;
  d.kind = OpKind::kAllreduce;
  d.dtype = dtype;
  d.op = op;
  d.shape = std::move(shape);
  return d;
}

// N ranks, each with its own table; a round goes through encode/decode as on the wire.
class Ranks {
 public:
  explicit Ranks(int n) : messages_(n) {
    for (int r = 0; r < n; ++r) tables_.emplace_back(n);
  }

  void Submit(int rank, const std::string& name, const Descriptor& d) {
    tables_[rank].Announce(rank, name, d, &messages_[rank]);
  }

  // Runs one round; returns each rank's ready names and checks that all ranks agree.
  std::vector<ReadyCollective> Round(Clock::time_point now = Clock::now()) {
    std::vector<RoundMessage> round;
    for (int r = 0; r < static_cast<int>(messages_.size()); ++r) {
      round.push_back(DecodeRound(EncodeRound(messages_[r]), r));
      last_bytes_ += EncodeRound(messages_[r]).size();
      messages_[r] = RoundMessage{};
    }
    std::vector<ReadyCollective> first;
    for (size_t r = 0; r < tables_.size(); ++r) {
      auto ready = tables_[r].Apply(round, now);
      if (r == 0) {
        first = ready;
        continue;
      }
      EXPECT_EQ(ready.size(), first.size());
      for (size_t i = 0; i < ready.size() && i < first.size(); ++i) {
        EXPECT_EQ(ready[i].name, first[i].name) << "rank " << r << " disagrees on the order";
        EXPECT_EQ(ready[i].mismatch, first[i].mismatch);
      }
    }
    return first;
  }

  // Horovod's join: `rank` has no more data.
  void Join(int rank) { messages_[rank].joined = true; }
  // Every rank's table must agree on whether, and by whom, a join completed this round.
  std::optional<int> JoinCompleted() {
    const auto first = tables_[0].TakeJoinCompleted();
    for (size_t r = 1; r < tables_.size(); ++r) EXPECT_EQ(tables_[r].TakeJoinCompleted(), first);
    return first;
  }

  NegotiationTable& table(int r) { return tables_[r]; }
  size_t TakeBytes() { return std::exchange(last_bytes_, 0); }

 private:
  std::vector<NegotiationTable> tables_;
  std::vector<RoundMessage> messages_;
  size_t last_bytes_ = 0;
};

std::vector<std::string> Names(const std::vector<ReadyCollective>& ready) {
  std::vector<std::string> names;
  for (const auto& c : ready) names.push_back(c.name);
  return names;
}

TEST(Negotiation, ACollectiveRunsOnceEveryRankSubmittedItWhateverTheOrder) {
  Ranks ranks(3);
  ranks.Submit(0, "a", Reduce({4}));
  ranks.Submit(0, "b", Reduce({4}));
  ranks.Submit(1, "b", Reduce({4}));
  EXPECT_TRUE(ranks.Round().empty());
  ranks.Submit(2, "b", Reduce({4}));
  ranks.Submit(2, "a", Reduce({4}));
  EXPECT_EQ(Names(ranks.Round()), std::vector<std::string>{"b"});
  ranks.Submit(1, "a", Reduce({4}));
  EXPECT_EQ(Names(ranks.Round()), std::vector<std::string>{"a"});
  EXPECT_EQ(ranks.table(0).pending(), 0u);
}

TEST(Negotiation, ReadyCollectivesComeInTheOrderTheyWereFirstAnnounced) {
  Ranks ranks(2);
  for (const char* name : {"x", "y", "z"}) ranks.Submit(0, name, Reduce({1}));
  for (const char* name : {"z", "x", "y"}) ranks.Submit(1, name, Reduce({1}));
  EXPECT_EQ(Names(ranks.Round()), (std::vector<std::string>{"x", "y", "z"}));
}

TEST(Negotiation, RepeatedNamesAreAnnouncedByNumber) {
  Ranks ranks(2);
  const std::string name = "model.layer4.conv2.weight.grad";
  for (int r = 0; r < 2; ++r) ranks.Submit(r, name, Reduce({256, 256, 3, 3}));
  ranks.Round();
  const size_t first = ranks.TakeBytes();
  for (int r = 0; r < 2; ++r) ranks.Submit(r, name, Reduce({256, 256, 3, 3}));
  EXPECT_EQ(Names(ranks.Round()), std::vector<std::string>{name});
  const size_t again = ranks.TakeBytes();
  EXPECT_LT(again, first / 3) << "a repeat should cost a number, not the name and shape";
  // A changed descriptor is announced in full again, and still matches.
  for (int r = 0; r < 2; ++r) ranks.Submit(r, name, Reduce({256, 256, 3, 3}, DType::kFloat64));
  auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].mismatch, "");
  EXPECT_EQ(ready[0].descriptors[1].dtype, DType::kFloat64);
}

TEST(Negotiation, RanksThatDisagreeGetOneDescriptionOfEveryRanksVersion) {
  Ranks ranks(3);
  ranks.Submit(0, "g", Reduce({4}));
  ranks.Submit(1, "g", Reduce({8}));
  ranks.Submit(2, "g", Reduce({4}, DType::kFloat32, ReduceOp::kAverage));
  auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_NE(ready[0].mismatch.find("'g'"), std::string::npos) << ready[0].mismatch;
  EXPECT_NE(ready[0].mismatch.find("rank 1 allreduce(sum) float32 (8,)"), std::string::npos)
      << ready[0].mismatch;
  EXPECT_NE(ready[0].mismatch.find("rank 2 allreduce(average)"), std::string::npos)
      << ready[0].mismatch;
}

TEST(Negotiation, PrioritiesTravelAreNoMismatchAndAChangeIsAnnouncedAgain) {
  Ranks ranks(2);
  Descriptor urgent = Reduce({4});
  urgent.priority = 7;
  Descriptor other = Reduce({4});
  other.priority = -3;
  ranks.Submit(0, "p", urgent);
  ranks.Submit(1, "p", other);  // a hint: rank 0's decides, the ranks need not agree
  auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].mismatch, "");
  EXPECT_EQ(ready[0].descriptors[0].priority, 7);
  EXPECT_EQ(ready[0].descriptors[1].priority, -3);
  // Rank 0 changes its priority: sent in full again, so the new one is what the others see.
  urgent.priority = 9;
  ranks.Submit(0, "p", urgent);
  ranks.Submit(1, "p", other);
  ready = ranks.Round();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].descriptors[0].priority, 9);
}

TEST(Negotiation, AllgatherInputsMayDifferOnlyInTheFirstDimension) {
  Ranks ranks(2);
  Descriptor a;
  a.kind = OpKind::kAllgather;
  a.shape = {1, 5};
  Descriptor b = a;
  b.shape = {3, 5};
  ranks.Submit(0, "ok", a);
  ranks.Submit(1, "ok", b);
  Descriptor c = a;
  c.shape = {1, 6};
  ranks.Submit(0, "bad", a);
  ranks.Submit(1, "bad", c);
  auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].mismatch, "");
  EXPECT_EQ(ready[0].descriptors[1].shape, (Shape{3, 5}));
  EXPECT_NE(ready[1].mismatch.find("dimension 0"), std::string::npos) << ready[1].mismatch;
}

TEST(Negotiation, WaitingCollectivesNameTheMissingRanks) {
  Ranks ranks(3);
  const auto start = Clock::now();
  ranks.Submit(1, "late", Reduce({1}));
  ranks.Round(start);
  EXPECT_TRUE(ranks.table(0).Waiting(start + Duration(500), Duration(1000)).empty());
  auto waiting = ranks.table(0).Waiting(start + Duration(1500), Duration(1000));
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(waiting[0].name, "late");
  EXPECT_EQ(waiting[0].missing_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(ranks.table(2).MissingRanks("late"), (std::vector<int>{0, 2}));
  EXPECT_TRUE(ranks.table(2).MissingRanks("unknown").empty());
}

TEST(Negotiation, DroppingThePendingOnADeadlockLetsTheNamesStartAfresh) {
  Ranks ranks(2);
  ranks.Submit(0, "x", Reduce({4}));
  ranks.Submit(1, "y", Reduce({4}));
  EXPECT_TRUE(ranks.Round().empty());
  for (int r = 0; r < 2; ++r) {
    const auto dropped = ranks.table(r).DropPending(Clock::now());
    ASSERT_EQ(dropped.size(), 2u);
    EXPECT_EQ(dropped[0].name, "x");
    EXPECT_EQ(dropped[0].missing_ranks, (std::vector<int>{1}));
    EXPECT_EQ(dropped[1].name, "y");
    EXPECT_EQ(dropped[1].missing_ranks, (std::vector<int>{0}));
    EXPECT_EQ(ranks.table(r).pending(), 0u);
  }
  // A rank's second "x" is not "announced twice", and needs every rank again.
  ranks.Submit(0, "x", Reduce({4}));
  EXPECT_TRUE(ranks.Round().empty());
  ranks.Submit(1, "x", Reduce({4}));
  const auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].name, "x");
  EXPECT_EQ(ready[0].mismatch, "");
}

TEST(Negotiation, WhereTheArraysLiveRoundTripsAndRanksMustAgreeOnIt) {
  RoundMessage m;
  Descriptor gpu = Reduce({2, 3});
  gpu.on_device = true;
  m.named.emplace_back("grad", gpu);
  const auto back = DecodeRound(EncodeRound(m), 0);
  ASSERT_EQ(back.named.size(), 1u);
  EXPECT_TRUE(back.named[0].second.on_device);

  Ranks ranks(2);
  ranks.Submit(0, "mixed", gpu);
  ranks.Submit(1, "mixed", Reduce({2, 3}));
  const auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_NE(ready[0].mismatch.find("rank 0 allreduce(sum) float32 (2,3) on the GPU, rank 1 "
                                   "allreduce(sum) float32 (2,3)"),
            std::string::npos)
      << ready[0].mismatch;
}

TEST(Negotiation, AlltoallSplitsAndEveryOpRoundTripAndFirstDimensionsMayDiffer) {
  Descriptor a2a;
  a2a.kind = OpKind::kAlltoall;
  a2a.shape = {5, 2};
  a2a.splits = {3, 2};
  RoundMessage m;
  m.named.emplace_back("a2a", a2a);
  m.named.emplace_back("max", Reduce({4}, DType::kFloat64, ReduceOp::kMax));
  m.named.emplace_back("product", Reduce({4}, DType::kFloat16, ReduceOp::kProduct));
  const auto back = DecodeRound(EncodeRound(m), 0);
  ASSERT_EQ(back.named.size(), 3u);
  EXPECT_EQ(back.named[0].second, a2a);
  EXPECT_EQ(back.named[1].second.op, ReduceOp::kMax);
  EXPECT_EQ(back.named[2].second.ToString(), "allreduce(product) float16 (4,)");

  Ranks ranks(2);
  Descriptor other = a2a;
  other.shape = {1, 2};
  other.splits = {0, 1};
  ranks.Submit(0, "a2a", a2a);
  ranks.Submit(1, "a2a", other);
  other.shape = {1, 3};
  ranks.Submit(0, "a2a.wide", a2a);
  ranks.Submit(1, "a2a.wide", other);
  const auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].mismatch, "");
  EXPECT_EQ(ready[0].descriptors[1].splits, (std::vector<int64_t>{0, 1}));
  EXPECT_NE(ready[1].mismatch.find("alltoall inputs may differ only in dimension 0"),
            std::string::npos)
      << ready[1].mismatch;

  // A rank whose splits do not fit its rows breaks the protocol (its engine checks them first).
  Ranks broken(2);
  Descriptor bad = a2a;
  bad.splits = {1, 1};
  broken.Submit(1, "bad", bad);
  EXPECT_THROW(broken.Round(), ProtocolError);
}

TEST(Negotiation, ReducescatterRowsAreAsEvenAsCanBeWithTheLowerRanksTakingTheRest) {
  EXPECT_EQ(ReducescatterRows(12, 3, 0), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(ReducescatterRows(12, 3, 2), (std::pair<int64_t, int64_t>{8, 4}));
  EXPECT_EQ(ReducescatterRows(7, 3, 0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(ReducescatterRows(7, 3, 1), (std::pair<int64_t, int64_t>{3, 2}));
  EXPECT_EQ(ReducescatterRows(7, 3, 2), (std::pair<int64_t, int64_t>{5, 2}));
  EXPECT_EQ(ReducescatterRows(1, 3, 2), (std::pair<int64_t, int64_t>{1, 0}));
}

TEST(Negotiation, ShutdownFlagAndEmptyMessagesRoundTrip) {
  RoundMessage m;
  m.shutting_down = true;
  auto back = DecodeRound(EncodeRound(m), 0);
  EXPECT_TRUE(back.shutting_down);
  EXPECT_TRUE(back.empty());
}

TEST(Negotiation, MalformedMessagesAreProtocolErrorsNamingTheRank) {
  RoundMessage m;
  m.named.emplace_back("grad", Reduce({2, 3}));
  m.numbered = {1, 2};
  const std::vector<char> good = EncodeRound(m);
  // Every truncation fails cleanly.
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<char> cut(good.begin(), good.begin() + n);
    EXPECT_THROW(DecodeRound(cut, 2), ProtocolError) << n;
  }
  auto corrupt = [&](size_t at, char value) {
    std::vector<char> bad = good;
    bad[at] = value;
    try {
      DecodeRound(bad, 2);
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(corrupt(0, 9).find("rank 2"), std::string::npos);             // version
  EXPECT_NE(corrupt(2, 0x7f).find("named count"), std::string::npos);     // huge count
  EXPECT_NE(corrupt(6 + 2 + 4 + 1, 9).find("dtype"), std::string::npos);  // dtype 9
  EXPECT_NE(corrupt(6 + 2 + 4 + 3 + 4, 99).find("dimensions"), std::string::npos);
  std::vector<char> trailing = good;
  trailing.push_back(0);
  EXPECT_THROW(DecodeRound(trailing, 0), ProtocolError);
}

TEST(Negotiation, AnUnknownNumberOrADoubleSubmissionIsAProtocolError) {
  NegotiationTable table(2);
  std::vector<RoundMessage> round(2);
  round[1].numbered = {7};
  EXPECT_THROW(table.Apply(round, Clock::now()), ProtocolError);

  NegotiationTable twice(2);
  std::vector<RoundMessage> r2(2);
  r2[0].named = {{"a", Reduce({1})}, {"a", Reduce({1})}};
  EXPECT_THROW(twice.Apply(r2, Clock::now()), ProtocolError);

  NegotiationTable root(2);
  std::vector<RoundMessage> r3(2);
  Descriptor b;
  b.kind = OpKind::kBroadcast;
  b.root = 5;
  r3[0].named = {{"b", b}};
  EXPECT_THROW(root.Apply(r3, Clock::now()), ProtocolError);
}

Descriptor Broadcast(Shape shape, int root) {
  Descriptor d = Reduce(std::move(shape));
  d.kind = OpKind::kBroadcast;
  d.root = root;
  return d;
}

TEST(NegotiationJoin, AJoinedRankStandsInForTheOthersAllreduces) {
  Ranks ranks(3);
  ranks.Join(0);
  EXPECT_TRUE(ranks.Round().empty());
  ranks.Submit(1, "g", Reduce({4}));
  ranks.Submit(2, "g", Reduce({4}));
  auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].mismatch.empty());
  EXPECT_EQ(ready[0].joined, (std::vector<char>{1, 0, 0}));
  EXPECT_EQ(ready[0].descriptors[0], Reduce({4}));  // rank 0 reduces zeros of the same shape
  EXPECT_FALSE(ranks.JoinCompleted());
}

TEST(NegotiationJoin, AnAllreduceWaitingForARankRunsOnceThatRankJoins) {
  Ranks ranks(3);
  ranks.Submit(1, "g", Reduce({2}));
  EXPECT_TRUE(ranks.Round().empty());
  ranks.Join(0);
  ranks.Join(2);
  auto ready = ranks.Round();
  ASSERT_EQ(Names(ready), std::vector<std::string>{"g"});
  EXPECT_EQ(ready[0].joined, (std::vector<char>{1, 0, 1}));
}

TEST(NegotiationJoin, TheJoinCompletesWhenEveryRankJoinedNamingTheLast) {
  Ranks ranks(3);
  ranks.Join(0);
  ranks.Round();
  EXPECT_FALSE(ranks.JoinCompleted());
  ranks.Join(2);
  ranks.Round();
  EXPECT_FALSE(ranks.JoinCompleted());
  ranks.Join(1);
  ranks.Round();
  EXPECT_EQ(ranks.JoinCompleted(), 1);
  EXPECT_FALSE(ranks.JoinCompleted());  // taken once
  // The joins start afresh: a collective of one rank waits for the others again.
  ranks.Submit(0, "next", Reduce({1}));
  EXPECT_TRUE(ranks.Round().empty());
  EXPECT_EQ(ranks.table(0).MissingRanks("next"), (std::vector<int>{1, 2}));
}

TEST(NegotiationJoin, OtherCollectivesFailWhileARankHasJoined) {
  Ranks ranks(2);
  ranks.Join(1);
  ranks.Submit(0, "b", Broadcast({3}, 0));
  auto ready = ranks.Round();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_NE(ready[0].mismatch.find("joined"), std::string::npos) << ready[0].mismatch;
}

TEST(NegotiationJoin, TheJoinedFlagRoundTripsAndUnknownFlagsAreRefused) {
  RoundMessage m;
  m.joined = true;
  auto back = DecodeRound(EncodeRound(m), 0);
  EXPECT_TRUE(back.joined);
  EXPECT_FALSE(back.shutting_down);
  EXPECT_FALSE(back.stuck);
  m.stuck = true;  // the deadlock vote
  EXPECT_TRUE(DecodeRound(EncodeRound(m), 0).stuck);
  std::vector<char> bytes = EncodeRound(m);
  bytes[1] = 0x40;
  EXPECT_THROW(DecodeRound(bytes, 3), ProtocolError);
  // A rank cannot join twice before the join completed.
  NegotiationTable table(2);
  std::vector<RoundMessage> round(2);
  round[0].joined = true;
  table.Apply(round, Clock::now());
  EXPECT_THROW(table.Apply(round, Clock::now()), ProtocolError);
}

}  // namespace
}  // namespace dtrain::collectives

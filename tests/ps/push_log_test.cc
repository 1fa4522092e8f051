// PushLog (push_log.h): a worker's pushes since its servers' checkpoints, repeated in order.
#include "ps/push_log.h"

#include <gtest/gtest.h>

#include <memory>

#include "dtrain/common/error.h"

namespace dtrain::ps {
namespace {

transport::Message Push(uint64_t key, uint32_t part, size_t bytes) {
  transport::Message m;
  m.header.command = transport::Command::kPushPull;
  m.header.key = key;
  m.header.part = part;
  auto buffer = std::shared_ptr<char[]>(new char[bytes + 1]);
  m.body.data = buffer.get();
  m.body.size = bytes;
  m.body.owner = std::move(buffer);
  return m;
}

TEST(PushLogTest, RoundsCountPerSlotAndRepeatsComeInTheOrderSent) {
  PushLog log(1 << 20, 2);
  uint64_t id = 100;
  for (int round = 1; round <= 3; ++round) {
    EXPECT_EQ(log.Record(0, id++, Push(1, 0, 8)).round, round);
    EXPECT_EQ(log.Record(1, id++, Push(1, 1, 8)).round, round);
    EXPECT_EQ(log.Record(0, id++, Push(2, 0, 8)).round, round);
  }
  EXPECT_EQ(log.bytes(), 9u * 8);
  // Server 0 restored key 1 at round 1 and key 2 at round 2.
  const auto again = log.Since(0, {{{1, 0}, 1}, {{2, 0}, 2}});
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(again[0].push.header.key, 1u);  // round 2 of key 1 (id 103)
  EXPECT_EQ(again[0].round, 2);
  EXPECT_EQ(again[1].push.header.key, 1u);  // round 3 of key 1 (id 106)
  EXPECT_EQ(again[2].push.header.key, 2u);  // round 3 of key 2 (id 108)
  EXPECT_LT(again[0].request_id, again[1].request_id);
  EXPECT_LT(again[1].request_id, again[2].request_id);
  // Repeated, a push needs no value back.
  EXPECT_EQ(again[0].push.header.command, transport::Command::kPush);
  // Server 1's slot, from round 0: all three.
  EXPECT_EQ(log.Since(1, {}).size(), 3u);
}

TEST(PushLogTest, ACheckpointTrimsItsRoundsOnly) {
  PushLog log(1 << 20, 2);
  for (int round = 1; round <= 4; ++round) log.Record(0, round, Push(1, 0, 8));
  log.Trim(1, {1, 0}, 3);  // another server's word about this slot: ignored
  EXPECT_EQ(log.bytes(), 32u);
  log.Trim(0, {1, 0}, 3);
  EXPECT_EQ(log.bytes(), 8u);
  const auto again = log.Since(0, {{{1, 0}, 3}});
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].round, 4);
}

TEST(PushLogTest, HalfTheBoundAsksForACheckpointOncePerAnswer) {
  PushLog log(400, 2);  // each server's share before asking: 100 bytes
  EXPECT_FALSE(log.Record(0, 1, Push(1, 0, 60)).ask_for_checkpoint);
  EXPECT_TRUE(log.Record(0, 2, Push(1, 0, 60)).ask_for_checkpoint);
  EXPECT_FALSE(log.Record(0, 3, Push(1, 0, 60)).ask_for_checkpoint);  // asked already
  EXPECT_FALSE(log.Record(1, 4, Push(2, 0, 60)).ask_for_checkpoint);
  log.Trim(0, {1, 0}, 3);
  log.CheckpointAnswered(0, 7);
  EXPECT_FALSE(log.Record(0, 5, Push(1, 0, 60)).ask_for_checkpoint);
  const PushLog::Recorded again = log.Record(0, 6, Push(1, 0, 60));
  EXPECT_TRUE(again.ask_for_checkpoint);
  EXPECT_EQ(again.heard_checkpoint, 7u);  // the server skips the ask if it took a later one
}

TEST(PushLogTest, TheDefaultBoundIs64RoundsOfPushesWithin256To512MB) {
  PushLog small(0, 1);
  small.Record(0, 1, Push(1, 0, 1000));
  EXPECT_EQ(small.bound(), PushLog::kAutoMinBytes);  // 64 KB of rounds: the floor

  // Two slots of 2 MB and 3 MB: a round is 5 MB, the bound 320 MB, a checkpoint asked for past
  // 160 MB (at the 33rd round).
  PushLog log(0, 1);
  uint64_t id = 0;
  for (int round = 1; round <= 32; ++round) {
    EXPECT_FALSE(log.Record(0, ++id, Push(1, 0, 2 << 20)).ask_for_checkpoint) << round;
    EXPECT_FALSE(log.Record(0, ++id, Push(2, 0, 3 << 20)).ask_for_checkpoint) << round;
  }
  EXPECT_EQ(log.bound(), size_t{320} << 20);
  EXPECT_TRUE(log.Record(0, ++id, Push(1, 0, 2 << 20)).ask_for_checkpoint);

  PushLog big(0, 1);
  big.Record(0, 1, Push(1, 0, 10 << 20));
  EXPECT_EQ(big.bound(), PushLog::kAutoMaxBytes);           // 640 MB of rounds: the ceiling
  EXPECT_EQ(PushLog(7 << 20, 1).bound(), size_t{7} << 20);  // DTRAIN_REPLAY_LOG_MB=7
}

TEST(PushLogTest, PastTheBoundOldPushesGoAndARestoreThatNeedsThemFails) {
  PushLog log(100, 1);
  for (int round = 1; round <= 5; ++round) log.Record(0, round, Push(1, 0, 40));
  EXPECT_LE(log.bytes(), 100u);
  EXPECT_EQ(log.Since(0, {{{1, 0}, 3}}).size(), 2u);  // rounds 4 and 5 are kept
  try {
    log.Since(0, {{{1, 0}, 1}});
    FAIL() << "rounds 2 and 3 were dropped, yet the repeat was allowed";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_REPLAY_LOG_MB"), std::string::npos) << e.what();
  }
}

TEST(PushLogTest, AReplacementWorkerCountsFromWhereItsRankWas) {
  PushLog log(1 << 20, 1);
  log.StartAt(0, {1, 0}, 7);
  EXPECT_EQ(log.Record(0, 1, Push(1, 0, 8)).round, 8);
  EXPECT_EQ(log.Since(0, {{{1, 0}, 7}}).size(), 1u);
  // Its lost process's rounds were never here: a restore before them cannot be repeated.
  EXPECT_THROW(log.Since(0, {{{1, 0}, 6}}), PeerError);
}

TEST(PushLogTest, AReplacementWorkersSlotsBelongToTheirServerBeforeItsFirstPush) {
  // Issue 63: the replacement's slots on server 1 were counted as server 0's until its first
  // push, so server 0 restored in that window threw for them ("restored key 1 at round 0").
  PushLog log(1 << 20, 2);
  log.StartAt(0, {0, 0}, 767);
  log.StartAt(1, {1, 0}, 767);
  EXPECT_TRUE(log.Since(0, {{{0, 0}, 767}}).empty());  // server 1's slot is not server 0's
  // Server 1 restored before the replacement's start is refused: those rounds were never here.
  EXPECT_THROW(log.Since(1, {{{1, 0}, 766}}), PeerError);
  EXPECT_TRUE(log.Since(1, {{{1, 0}, 767}}).empty());
}

}  // namespace
}  // namespace dtrain::ps

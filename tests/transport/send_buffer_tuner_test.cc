#include "transport/tcp/send_buffer_tuner.h"

#include <gtest/gtest.h>

namespace dtrain::transport {
namespace {

constexpr double kMbit = 1e6 / 8;  // bytes/s

SendBufferLimits Limits() {
  SendBufferLimits lim;
  lim.ceiling = 8 << 20;
  return lim;
}

TEST(SendBufferTuner, NothingMeasuredLeavesTheBuffer) {
  EXPECT_EQ(NextSendBuffer(0, 0, 100, Limits()), 0u);
  EXPECT_EQ(NextSendBuffer(65536, 200 * kMbit, 0, Limits()), 0u);
}

// A connection's share of a slow link at a LAN's round trip: 2 KB of room, so the floor.
TEST(SendBufferTuner, ASlowLinkGetsTheFloor) {
  EXPECT_EQ(NextSendBuffer(0, 7 * kMbit, 150, Limits()), 32u * 1024);
}

// 1 Gbit/s at 1 ms: the round trip and the 2 ms budget at that rate.
TEST(SendBufferTuner, TheBufferHoldsTheRoundTripAndTheBudget) {
  EXPECT_EQ(NextSendBuffer(0, 1000 * kMbit, 1000, Limits()), 375000u);
}

// Where the kernel refused the floor (current 0: it still autotunes), a buffer that needs 5 MB
// (10 Gbit/s at 2 ms), beyond half of what SO_SNDBUF may hold (8 MB here), is left to autotuning,
// which reaches further; at 200 us, 2.75 MB is capped.
TEST(SendBufferTuner, AnAutotunedBufferIsCappedOnlyWellUnderTheCeiling) {
  EXPECT_EQ(NextSendBuffer(0, 10000 * kMbit, 2000, Limits()), 0u);
  EXPECT_EQ(NextSendBuffer(0, 10000 * kMbit, 200, Limits()), 2750000u);
}

TEST(SendBufferTuner, ACappedBufferFollowsOnlyMovesOfMoreThanAQuarter) {
  const size_t current = 375000;
  EXPECT_EQ(NextSendBuffer(current, 1100 * kMbit, 1000, Limits()), 0u);       // +10%
  EXPECT_EQ(NextSendBuffer(current, 2000 * kMbit, 1000, Limits()), 750000u);  // doubled
  EXPECT_EQ(NextSendBuffer(current, 100 * kMbit, 1000, Limits()), 37500u);    // a tenth
}

// Where the buffer is what limits a connection, it sends buffer / round trip. The buffer size
// after `looks` looks, starting from `start`, when the connection adds `added_us` to its smallest
// round trip `min_rtt_us`.
size_t AfterLooks(double added_us, size_t start, double min_rtt_us = 100, int looks = 20) {
  const SendBufferLimits lim = Limits();
  size_t buffer = start;
  for (int look = 0; look < looks; ++look) {
    const double rate = buffer / ((min_rtt_us + added_us) / 1e6);
    if (const size_t next = NextSendBuffer(buffer, rate, min_rtt_us, lim)) buffer = next;
  }
  return buffer;
}

// Adding less than the budget (the peer's processing, a short queue), it grows to the ceiling;
// adding more (a deep queue filling), it shrinks to the floor.
TEST(SendBufferTuner, TheBufferGrowsUnderTheBudgetAndShrinksOverIt) {
  EXPECT_EQ(AfterLooks(300, Limits().floor), Limits().ceiling);
  EXPECT_EQ(AfterLooks(20000, Limits().ceiling), Limits().floor);
}

// A round trip longer than the budget (20 ms) doubles the buffer per look, from the floor.
TEST(SendBufferTuner, ALongRoundTripDoublesTheBufferPerLook) {
  EXPECT_EQ(AfterLooks(0, 32 * 1024, 20000, 3), 8u * 32 * 1024);
}

}  // namespace
}  // namespace dtrain::transport

// DTRAIN_TCP_SNDBUF=auto: the kernel send buffer of a connection to another host, sized from what
// the connection itself measures.
//
// Linux grows a send buffer until it holds the congestion window, and a loss-based congestion
// control grows that window until the network's queue is full: on a slow link with a deep queue
// every connection ends up with megabytes queued ahead of whatever is sent next, and the priority
// of the first layers' values cannot take effect (docs/performance.md: 807 against 683 ms a step,
// N = 4 at 200 Mbit/s). A fixed small buffer cures that and caps fast links.
//
// The tuner starts each connection at the floor (32 KiB) and then gives it room for its round
// trip plus a delay budget (2 ms, or the round trip where that is longer) at the rate it sends
// while it has data out: rate x (smallest round trip + budget). Where that buffer is what limits
// the connection, the next look finds rate = buffer / (the round trip it sees), so the buffer
// grows while what the connection adds to the round trip (queueing, the peer's processing) stays
// under the budget, and shrinks when it is over: a connection keeps at most about 2 ms of its own
// sending queued in the network (one round trip's worth where that is longer), whatever the
// link's speed. Starting from the kernel's autotuning instead let the first steps fill the queues
// (2-4% slower steps at 200 Mbit/s). The most it reaches is what SO_SNDBUF may hold, twice
// net.core.wmem_max (416 KiB with Linux's default), where autotuning may reach
// net.ipv4.tcp_wmem's maximum (4 MiB): on a long fat link (a round trip of milliseconds at
// 10 Gbit/s) DTRAIN_TCP_SNDBUF=0 keeps autotuning.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::transport {

struct SendBufferLimits {
  size_t floor = 32 * 1024;  // never smaller: a few segments, and what slow links measured best
  size_t ceiling = 0;        // the most SO_SNDBUF may hold (twice net.core.wmem_max)
  double budget_us = 2000;   // the queueing a connection may add to its round trip
};

// The buffer a connection that sent at `rate` bytes/s while busy, at a smallest round trip of
// `min_rtt_us`, should have, given the one it has (`current`; 0 where the kernel refused the
// floor and still autotunes): 0 to leave it as it is. A set buffer follows the target when it
// moves by more than a quarter; an autotuned one is capped only when the target is under half the
// ceiling (beyond it autotuning reaches further than SO_SNDBUF may).
size_t NextSendBuffer(size_t current, double rate, double min_rtt_us, const SendBufferLimits& lim);

// One connection's tuner, which sets the floor at once. It borrows the socket's descriptor, which
// must outlive it, and is not thread-safe: its owner calls AfterWrite with every completed write,
// under the lock that serializes them. Once per kCheckBytes written it reads the connection's
// TCP_INFO; once the connection has been busy (data out, not yet acknowledged) for kMinBusyUs
// since the last estimate, it takes the bytes acknowledged over that busy time as the rate (not
// the kernel's delivery rate, its latest sample, which a token bucket's burst inflated a
// hundredfold here) and resizes SO_SNDBUF when NextSendBuffer says so.
class SendBufferTuner {
 public:
  static constexpr size_t kCheckBytes = size_t{1} << 20;
  // The kernel counts busy time in jiffies (4-10 ms): 50 ms keeps that error within 8-20%.
  static constexpr uint64_t kMinBusyUs = 50000;

  explicit SendBufferTuner(int fd);
  void AfterWrite(size_t bytes);
  size_t buffer() const { return current_; }  // 0: still the kernel's autotuning

 private:
  void Resize(size_t bytes, double rate, uint32_t min_rtt_us);

  int fd_;
  size_t since_check_ = 0;
  bool started_ = false;
  uint64_t acked_ = 0;  // tcpi_bytes_acked at the last estimate
  uint64_t busy_ = 0;   // tcpi_busy_time (us) then
  size_t current_ = 0;
  SendBufferLimits limits_;
};

// Twice /proc/sys/net/core/wmem_max (the kernel doubles what SO_SNDBUF asks for), read once.
size_t SendBufferCeiling();

// Sets socket `fd`'s send buffer to hold `bytes` as net.ipv4.tcp_wmem counts them (the kernel
// doubles what SO_SNDBUF asks for, for its bookkeeping, so this asks for half); false where the
// kernel refuses. The kernel autotunes that buffer no more.
bool SetSendBuffer(int fd, size_t bytes);

}  // namespace dtrain::transport

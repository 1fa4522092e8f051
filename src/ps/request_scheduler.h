// RequestScheduler: runs a server's data requests (push, pull, pushpull) off the transport's
// threads, so that receiving the next body overlaps applying the last one, and so that an urgent
// request that arrives behind big ones does not wait for all of them.
//
// Why: a transport thread that applies what it received reads nothing meanwhile, and the requests
// of one stream are read in the order they were sent. Backward produces the last layer's gradient
// first and the first layer's last, and the next forward needs the first layer's weights first:
// its small push, sent last, used to be applied only after every big piece ahead of it on its
// stream had been copied and applied (docs/performance.md, "The 1x1 step emulated on CPUs"). Here
// it waits at most for the requests already running. As in BytePS's and P3's priority scheduling,
// urgency is the sender's: Header::priority (MXNet's push/pull priority, -layer index).
//
// Order: one slot's (key, part) requests run one at a time (a cheap one run inline included), in
// the order they were queued, which is the order each sender sent them (one slot's messages use one
// stream). Among slots, the one whose next request has the highest priority runs first; equal
// priorities run in arrival order. Different slots' requests run concurrently on `threads` threads.
// Control requests (init, the optimizer, commands) and membership changes are not queued: the
// server calls Fence first, so they see every data request that arrived before them applied, as
// when everything ran in order.
//
// Requests the caller calls cheap (the server: small bodies, and pushes that only replace the
// value) run on the transport's thread instead when their slot is idle.
//
// Memory: queued bodies are held until their request has run; Enqueue waits (up to `full_wait`,
// then queues anyway, logged) while they exceed `max_queued_bytes`, which pushes back on the
// senders through TCP as an applying transport thread did.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/common/deadline.h"
#include "transport/message.h"

namespace dtrain::ps {

class RequestScheduler {
 public:
  using Handler = std::function<void(transport::Message&&)>;

  // `handle` runs each request; it should not throw (one that does is logged, and the slot's next
  // request runs). With 0 threads every request runs on the thread that submits it.
  RequestScheduler(int threads, size_t max_queued_bytes, Duration full_wait, Handler handle);
  // Drops what has not started, waits for what is running, joins the threads.
  ~RequestScheduler();
  RequestScheduler(const RequestScheduler&) = delete;
  RequestScheduler& operator=(const RequestScheduler&) = delete;

  // Queues `msg`; or, if `cheap` and its slot has nothing queued or running, runs it at once on
  // the caller's thread, which costs a small request no thread hand-off (it doubled a 4 KB
  // pushpull's round trip) and keeps every order above: the slot's next request from the same
  // sender arrives on the same thread, after this one has run.
  void Submit(transport::Message&& msg, bool cheap);
  // Waits until every request submitted before the call has run (at most `timeout`: then logs and
  // returns false). Returns at once inside a request (on a scheduler thread, or a cheap one run
  // inline), where waiting could never end.
  bool Fence(Duration timeout);

  // Requests queued or running (for tests and the log).
  size_t outstanding() const;

 private:
  using SlotId = std::pair<uint64_t, uint32_t>;
  struct Queued {
    transport::Message msg;
    uint64_t seq;
  };
  struct SlotQueue {
    std::deque<Queued> requests;
    bool running = false;
  };
  // Ready slots, most urgent first: (-priority of its next request, that request's seq, slot).
  using ReadyEntry = std::tuple<int, uint64_t, SlotId>;

  void Enqueue(transport::Message&& msg);
  void Run(transport::Message&& msg);  // the handler, never throwing
  void Loop();
  void Stop();  // ends and joins the threads
  // mutex_ held: queue a request behind the slot's; the slot's next request is ready to run; the
  // request `seq` of slot `id` (holding `bytes` of body) ran.
  void Append(const SlotId& id, transport::Message&& msg);
  void MarkReady(const SlotId& id, const SlotQueue& slot);
  void Finish(const SlotId& id, uint64_t seq, size_t bytes);

  const size_t max_queued_bytes_;
  const Duration full_wait_;
  const Handler handle_;

  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;  // a slot became ready, or stop
  std::condition_variable done_cv_;   // a request finished (fences, and room for bodies)
  std::map<SlotId, SlotQueue> slots_;
  std::set<ReadyEntry> ready_;
  std::set<uint64_t> outstanding_;  // seqs queued or running
  uint64_t next_seq_ = 0;
  size_t queued_bytes_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;  // last: they start once the members above exist
};

}  // namespace dtrain::ps

// OperationState: what an Operation (dtrain/kvstore/operation.h) waits on. A store makes one per
// call with the number of parts it waits for (a request per server, for instance) and marks each
// part done from whichever thread finishes it. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/common/deadline.h"
#include "dtrain/kvstore/operation.h"

namespace dtrain {

class OperationState {
 public:
  // `spin`: how long Wait polls, yielding the core, before it sleeps (common/poll_yielding.h;
  // DTRAIN_SPIN_WAIT_US, given by a DistKVStore where the host has a core for each of its
  // workers). Zero: it sleeps at once.
  OperationState(std::string what, int parts, Duration timeout,
                 std::chrono::microseconds spin = std::chrono::microseconds(0))
      : what_(std::move(what)), remaining_(parts), timeout_(timeout), spin_(spin) {}

  // One part finished; `error` (if not null) fails the whole operation. The first error wins.
  void PartDone(std::exception_ptr error = nullptr);
  // Runs `fn` once the operation is done: at once on this thread if it already is, else on the
  // thread of the last part, in the order they were added. Any number of these (the timeline's
  // spans, Operation::OnDone); they must not throw.
  void WhenDone(std::function<void()> fn);

  bool done() const;
  // Waits for the operation; rethrows its error; throws TimeoutError at the deadline.
  void Wait(Duration timeout) const;
  void Wait() const { Wait(timeout_); }
  const std::string& what() const { return what_; }
  Duration timeout() const { return timeout_; }

 private:
  const std::string what_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  int remaining_;
  std::exception_ptr error_;
  const Duration timeout_;
  const std::chrono::microseconds spin_;
  std::vector<std::function<void()>> when_done_;
};

}  // namespace dtrain

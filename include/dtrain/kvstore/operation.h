// Operation: a handle on an asynchronous KVStore call (push, pull, pushpull).
//
// KVStore calls return at once so that communication overlaps computation; Wait() blocks until the
// call has finished and rethrows its error, if any. Waits are bounded: past the deadline (the
// job's DTRAIN_REQUEST_TIMEOUT_MS unless given) Wait throws TimeoutError saying what it waited for.
// Copies share state. Thread-safe.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/common/deadline.h"

namespace dtrain {

class OperationState {
 public:
  OperationState(std::string what, int parts, Duration timeout)
      : what_(std::move(what)), remaining_(parts), timeout_(timeout) {}

  // One part finished; `error` (if not null) fails the whole operation. The first error wins.
  void PartDone(std::exception_ptr error = nullptr);
  // Adds parts still to come (before the last part is done).
  void AddParts(int n);
  // Runs `fn` once the operation is done: at once on this thread if it already is, else on the
  // thread of the last part, in the order they were added. Any number of these (the timeline's
  // spans, Operation::Then); they must not throw.
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
  std::vector<std::function<void()>> when_done_;
};

class Operation {
 public:
  Operation() = default;  // an operation that is already complete
  explicit Operation(std::shared_ptr<OperationState> state) { states_.push_back(std::move(state)); }

  // One operation that is done when all of `ops` are.
  static Operation Combine(const std::vector<Operation>& ops);

  bool done() const;
  void Wait() const;
  void Wait(Duration timeout) const;

  // An operation that is done once this one is and `next` has then run (on the thread that
  // finished this one). It fails with this one's error (and `next` does not run), or with what
  // `next` throws. `what` names it in timeouts.
  Operation Then(std::function<void()> next, std::string what) const;
  // Runs `fn` once this operation is done, with its first error or nullptr: at once on this thread
  // if it already is, else on the thread that finished it. `fn` must not throw.
  void OnDone(std::function<void(std::exception_ptr)> fn) const;

 private:
  std::vector<std::shared_ptr<OperationState>> states_;
};

}  // namespace dtrain

// Operation: a handle on an asynchronous KVStore call (push, pull, pushpull).
//
// KVStore calls return at once so that communication overlaps computation; Wait() blocks until the
// call has finished and rethrows its error, if any. Waits are bounded: past the deadline (the
// job's DTRAIN_REQUEST_TIMEOUT_MS unless given) Wait throws TimeoutError saying what it waited for.
// Copies share state. Thread-safe.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "dtrain/common/deadline.h"

namespace dtrain {

// What an Operation waits on; private to dtrain (the stores make them).
class OperationState;

class Operation {
 public:
  Operation() = default;  // an operation that is already complete
  explicit Operation(std::shared_ptr<OperationState> state) { states_.push_back(std::move(state)); }

  // One operation that is done when all of `ops` are.
  static Operation Combine(const std::vector<Operation>& ops);

  bool done() const;
  void Wait() const;
  void Wait(Duration timeout) const;

  // Runs `fn` once this operation is done, with its first error or nullptr: at once on this thread
  // if it already is, else on the thread that finished it. `fn` must not throw.
  void OnDone(std::function<void(std::exception_ptr)> fn) const;

 private:
  std::vector<std::shared_ptr<OperationState>> states_;
};

}  // namespace dtrain

#include "dtrain/kvstore/operation.h"

#include "dtrain/common/error.h"

namespace dtrain {

void OperationState::PartDone(std::exception_ptr error) {
  std::function<void()> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error && !error_) error_ = error;
    if (--remaining_ > 0) return;
    cv_.notify_all();
    done = std::move(on_done_);
  }
  if (done) done();
}

void OperationState::AddParts(int n) {
  std::lock_guard<std::mutex> lock(mutex_);
  remaining_ += n;
}

bool OperationState::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return remaining_ <= 0;
}

void OperationState::Wait(Duration timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [this] { return remaining_ <= 0; })) {
    throw TimeoutError(what_ + " did not finish within " + std::to_string(Seconds(timeout)) +
                       " s (DTRAIN_REQUEST_TIMEOUT_MS); " + std::to_string(remaining_) +
                       " part(s) still outstanding");
  }
  if (error_) std::rethrow_exception(error_);
}

Operation Operation::Combine(const std::vector<Operation>& ops) {
  Operation all;
  for (const auto& op : ops) {
    all.states_.insert(all.states_.end(), op.states_.begin(), op.states_.end());
  }
  return all;
}

bool Operation::done() const {
  for (const auto& s : states_) {
    if (!s->done()) return false;
  }
  return true;
}

void Operation::Wait() const {
  for (const auto& s : states_) s->Wait();
}

void Operation::Wait(Duration timeout) const {
  const Deadline deadline(timeout);
  for (const auto& s : states_) s->Wait(deadline.left());
}

}  // namespace dtrain

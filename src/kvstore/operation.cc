#include "dtrain/kvstore/operation.h"

#include <atomic>

#include "dtrain/common/error.h"

namespace dtrain {

void OperationState::PartDone(std::exception_ptr error) {
  std::vector<std::function<void()>> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error && !error_) error_ = error;
    if (--remaining_ > 0) return;
    cv_.notify_all();
    waiting.swap(when_done_);
  }
  for (auto& fn : waiting) fn();
}

void OperationState::WhenDone(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (remaining_ > 0) {
      when_done_.push_back(std::move(fn));
      return;
    }
  }
  fn();
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

Operation Operation::Then(std::function<void()> next, std::string what) const {
  auto inner = states_;
  auto state = std::make_shared<OperationState>(
      std::move(what), 1, inner.empty() ? Duration(std::chrono::hours(1)) : inner[0]->timeout());
  auto run = [inner, state, next = std::move(next)] {
    try {
      for (const auto& s : inner) s->Wait(Duration::zero());  // rethrows the first error
      next();
      state->PartDone();
    } catch (...) {
      state->PartDone(std::current_exception());
    }
  };
  if (inner.empty()) {
    run();
    return Operation(state);
  }
  // `run` goes on the last of the inner operations to finish.
  auto left = std::make_shared<std::atomic<size_t>>(inner.size());
  auto shared_run = std::make_shared<decltype(run)>(std::move(run));
  for (const auto& s : inner) {
    s->WhenDone([left, shared_run] {
      if (left->fetch_sub(1) == 1) (*shared_run)();
    });
  }
  return Operation(state);
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

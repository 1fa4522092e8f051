#include "dtrain/kvstore/operation.h"

#include <algorithm>
#include <atomic>

#include "common/poll_yielding.h"
#include "dtrain/common/error.h"
#include "kvstore/operation_state.h"

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

bool OperationState::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return remaining_ <= 0;
}

void OperationState::Wait(Duration timeout) const {
  const auto deadline = Clock::now() + timeout;
  if (spin_.count() > 0) {  // polls first (common/poll_yielding.h says why)
    PollYielding(mutex_, std::min(deadline, Clock::now() + spin_),
                 [this] { return remaining_ <= 0; });
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_until(lock, deadline, [this] { return remaining_ <= 0; })) {
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

void Operation::OnDone(std::function<void(std::exception_ptr)> fn) const {
  auto inner = states_;
  auto finish = [inner, fn = std::move(fn)] {
    std::exception_ptr error;
    for (const auto& s : inner) {
      try {
        s->Wait(Duration::zero());  // done: rethrows its error, if any
      } catch (...) {
        error = std::current_exception();
        break;
      }
    }
    fn(error);
  };
  if (inner.empty()) {
    finish();
    return;
  }
  // `finish` goes on the last of the inner operations to finish.
  auto left = std::make_shared<std::atomic<size_t>>(inner.size());
  auto shared_finish = std::make_shared<decltype(finish)>(std::move(finish));
  for (const auto& s : inner) {
    s->WhenDone([left, shared_finish] {
      if (left->fetch_sub(1) == 1) (*shared_finish)();
    });
  }
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

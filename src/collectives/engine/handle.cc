// A submission's handle: its completion, waited for with the submission's deadline.
#include "collectives/engine/engine.h"
#include "collectives/error_text.h"
#include "common/poll_yielding.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {

bool Handle::State::Complete(std::exception_ptr e, Array r) {
  std::function<void(std::exception_ptr)> callback;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (done) return false;
    done = true;
    error = std::move(e);
    result = std::move(r);
    callback = std::move(on_done);
  }
  done_cv.notify_all();
  if (callback) callback(error);
  return true;
}

namespace {
Handle::State& Checked(const std::shared_ptr<Handle::State>& state) {
  if (!state) throw InvalidArgument("empty collectives::Handle (not returned by a submission)");
  return *state;
}
}  // namespace

bool Handle::done() const {
  auto& s = Checked(state_);
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.done;
}

void Handle::OnDone(std::function<void(std::exception_ptr)> callback) const {
  auto& s = Checked(state_);
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.done) {
      s.on_done = std::move(callback);
      return;
    }
    error = s.error;
  }
  callback(error);
}

void Handle::Wait() const {
  auto& s = Checked(state_);
  // Counted while waiting: a thread that waits submits nothing meanwhile (engine.cc's deadlock
  // vote).
  struct Counted {
    explicit Counted(std::atomic<int>* c) : count(c) {
      if (count) count->fetch_add(1);
    }
    ~Counted() {
      if (count) count->fetch_sub(1);
    }
    std::atomic<int>* count;
  } counted(s.waiters.get());
  if (s.spin.count() > 0) {  // polls first (common/poll_yielding.h says why)
    PollYielding(
        s.mutex, std::min(s.deadline, Clock::now() + s.spin), [&] { return s.done; },
        [&] { return s.help_round && s.help_round(); });
  }
  std::unique_lock<std::mutex> lock(s.mutex);
  if (!s.done_cv.wait_until(lock, s.deadline, [&] { return s.done; })) {
    throw TimeoutError(
        s.what + " did not finish within " + SecondsText(s.timeout) +
        " of its submission (DTRAIN_COLLECTIVE_TIMEOUT_MS)" +
        (s.waiting_for.empty() ? std::string("") : "; " + s.waiting_for + " had not submitted it"));
  }
  if (s.error) std::rethrow_exception(s.error);
}

Array Handle::result() const {
  auto& s = Checked(state_);
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.result;
}

std::vector<int64_t> Handle::received_rows() const {
  auto& s = Checked(state_);
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.received_rows;
}

}  // namespace dtrain::collectives

#include "collectives/gloo/gloo_watchdog.h"

#include "common/logging.h"

namespace dtrain::collectives {

GlooWatchdog::GlooWatchdog(std::function<std::string()> who_left,
                           std::function<void(const std::string&)> on_lost)
    : who_left_(std::move(who_left)), on_lost_(std::move(on_lost)) {
  thread_ = std::thread([this] { Run(); });
}

GlooWatchdog::~GlooWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

GlooWatchdog::Call::Call(GlooWatchdog* watchdog,
                         std::vector<gloo::transport::UnboundBuffer*> buffers,
                         std::function<void()> abort)
    : watchdog_(watchdog) {
  if (!watchdog_) return;
  {
    std::lock_guard<std::mutex> lock(watchdog_->mutex_);
    watchdog_->active_ = true;
    ++watchdog_->call_;
    watchdog_->started_ = std::chrono::steady_clock::now();
    watchdog_->buffers_ = std::move(buffers);
    watchdog_->abort_ = std::move(abort);
    watchdog_->found_.clear();
  }
  watchdog_->wake_.notify_all();
}

GlooWatchdog::Call::~Call() {
  if (!watchdog_) return;
  // Under the lock: once this returns, the watchdog no longer touches the buffers.
  std::lock_guard<std::mutex> lock(watchdog_->mutex_);
  watchdog_->active_ = false;
  watchdog_->buffers_.clear();
  watchdog_->abort_ = nullptr;
}

std::string GlooWatchdog::found() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return found_;
}

void GlooWatchdog::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (!active_) {
      wake_.wait(lock);
      continue;
    }
    const uint64_t call = call_;
    const auto ask_at = started_ + kQuietPeriod;
    if (std::chrono::steady_clock::now() < ask_at) {
      wake_.wait_until(lock, ask_at);
      continue;
    }
    if (found_.empty()) {
      lock.unlock();
      const std::string lost = who_left_();  // a round trip to rank 0: not under the lock
      lock.lock();
      if (!active_ || call_ != call) continue;
      if (!lost.empty()) {
        found_ = lost;
        DTRAIN_LOG(kConnections) << "collectives: " << lost << "; aborting the gloo call";
        lock.unlock();
        on_lost_(lost);
        lock.lock();
        continue;
      }
    } else {
      // A wait that an abort released may be followed by another: keep releasing until the call
      // returns.
      for (auto* buffer : buffers_) {
        buffer->abortWaitSend();
        buffer->abortWaitRecv();
      }
      if (abort_) abort_();
    }
    wake_.wait_for(lock, found_.empty() ? kAskEvery : std::chrono::milliseconds(20));
  }
}

}  // namespace dtrain::collectives

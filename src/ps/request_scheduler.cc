#include "ps/request_scheduler.h"

#include <algorithm>

#include "common/logging.h"

namespace dtrain::ps {

RequestScheduler::RequestScheduler(int threads, size_t max_queued_bytes, Duration full_wait,
                                   Handler handle)
    : max_queued_bytes_(max_queued_bytes), full_wait_(full_wait), handle_(std::move(handle)) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

RequestScheduler::~RequestScheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  ready_cv_.notify_all();
  done_cv_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void RequestScheduler::Submit(transport::Message&& msg, bool cheap) {
  if (threads_.empty()) return Run(std::move(msg));
  if (cheap) {
    bool idle;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      idle = slots_.count({msg.header.key, msg.header.part}) == 0;
    }
    if (idle) return Run(std::move(msg));
  }
  Enqueue(std::move(msg));
}

void RequestScheduler::Run(transport::Message&& msg) {
  try {
    handle_(std::move(msg));
  } catch (const std::exception& e) {
    DTRAIN_LOG(kError) << "a data request failed: " << e.what();
  } catch (...) {
    DTRAIN_LOG(kError) << "a data request failed with an unknown exception";
  }
}

void RequestScheduler::Enqueue(transport::Message&& msg) {
  const size_t bytes = msg.body.size;
  std::unique_lock<std::mutex> lock(mutex_);
  // One body bigger than the bound still goes in once nothing else is queued.
  const auto has_room = [&] {
    return stop_ || queued_bytes_ == 0 || queued_bytes_ + bytes <= max_queued_bytes_;
  };
  if (!done_cv_.wait_for(lock, full_wait_, has_room)) {
    DTRAIN_LOG(kWarning) << "requests waiting to be applied hold " << queued_bytes_
                         << " bytes, more than " << max_queued_bytes_ << " for "
                         << Seconds(full_wait_) << " s; queuing one more anyway";
  }
  if (stop_) return;
  const SlotId id{msg.header.key, msg.header.part};
  const uint64_t seq = next_seq_++;
  SlotQueue& slot = slots_[id];
  slot.requests.push_back(Queued{std::move(msg), seq});
  outstanding_.insert(seq);
  queued_bytes_ += bytes;
  if (!slot.running && slot.requests.size() == 1) {
    MarkReady(id, slot);
    lock.unlock();
    ready_cv_.notify_one();
  }
}

void RequestScheduler::MarkReady(const SlotId& id, const SlotQueue& slot) {
  const Queued& next = slot.requests.front();
  ready_.emplace(-static_cast<int>(next.msg.header.priority), next.seq, id);
}

bool RequestScheduler::Fence(Duration timeout) {
  if (threads_.empty() || OnOwnThread()) return true;
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t fence = next_seq_;
  const auto passed = [&] { return outstanding_.empty() || *outstanding_.begin() >= fence; };
  if (done_cv_.wait_for(lock, timeout, passed)) return true;
  DTRAIN_LOG(kWarning) << outstanding_.size() << " data request(s) still not applied after "
                       << Seconds(timeout) << " s; going on without them";
  return false;
}

size_t RequestScheduler::outstanding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outstanding_.size();
}

bool RequestScheduler::OnOwnThread() const {
  const auto self = std::this_thread::get_id();
  return std::any_of(threads_.begin(), threads_.end(),
                     [self](const std::thread& t) { return t.get_id() == self; });
}

void RequestScheduler::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ready_cv_.wait(lock, [this] { return stop_ || !ready_.empty(); });
    if (stop_) return;
    const SlotId id = std::get<2>(*ready_.begin());
    ready_.erase(ready_.begin());
    SlotQueue& slot = slots_[id];
    Queued request = std::move(slot.requests.front());
    slot.requests.pop_front();
    slot.running = true;
    const size_t bytes = request.msg.body.size;
    lock.unlock();
    Run(std::move(request.msg));
    request.msg = {};  // its body is released before it stops counting against the bound
    lock.lock();
    outstanding_.erase(request.seq);
    queued_bytes_ -= bytes;
    SlotQueue& same = slots_[id];  // the map may have changed, the slot has not moved
    same.running = false;
    if (same.requests.empty()) {
      slots_.erase(id);
    } else {
      MarkReady(id, same);
      ready_cv_.notify_one();
    }
    done_cv_.notify_all();
  }
}

}  // namespace dtrain::ps

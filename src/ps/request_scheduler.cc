#include "ps/request_scheduler.h"

#include <algorithm>

#include "common/logging.h"

namespace dtrain::ps {

namespace {
// Set while this thread runs a request (on a scheduler thread or inline): a Fence from inside a
// request (a reply that finds its peer lost reaches the server's OnWorkerLost) must not wait for
// the request it is part of.
thread_local bool running_a_request = false;
}  // namespace

RequestScheduler::RequestScheduler(int threads, size_t max_queued_bytes, Duration full_wait,
                                   Handler handle)
    : max_queued_bytes_(max_queued_bytes), full_wait_(full_wait), handle_(std::move(handle)) {
  try {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  } catch (...) {
    Stop();  // the threads that did start, or their joinable handles would end the process
    throw;
  }
}

RequestScheduler::~RequestScheduler() { Stop(); }

void RequestScheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  ready_cv_.notify_all();
  done_cv_.notify_all();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}

void RequestScheduler::Submit(transport::Message&& msg, bool cheap) {
  if (threads_.empty()) return Run(std::move(msg));
  if (!cheap) return Enqueue(std::move(msg));
  const SlotId id{msg.header.key, msg.header.part};
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return;
    if (slots_.count(id) != 0) {
      // Busy: behind what the slot has waiting or running. Cheap, so the bound does not apply.
      return Append(id, std::move(msg));
    }
    // Runs here, but counts as the slot's running request, so that the slot's other requests
    // (another sender's, on another thread) wait for it and fences see it.
    slots_[id].running = true;
    seq = next_seq_++;
    outstanding_.insert(seq);
  }
  Run(std::move(msg));
  std::lock_guard<std::mutex> lock(mutex_);
  Finish(id, seq, 0);
}

void RequestScheduler::Run(transport::Message&& msg) {
  running_a_request = true;
  try {
    handle_(std::move(msg));
  } catch (const std::exception& e) {
    DTRAIN_LOG(kError) << "a data request failed: " << e.what();
  } catch (...) {
    DTRAIN_LOG(kError) << "a data request failed with an unknown exception";
  }
  running_a_request = false;
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
  Append({msg.header.key, msg.header.part}, std::move(msg));
}

void RequestScheduler::Append(const SlotId& id, transport::Message&& msg) {
  const uint64_t seq = next_seq_++;
  queued_bytes_ += msg.body.size;
  outstanding_.insert(seq);
  SlotQueue& slot = slots_[id];
  slot.requests.push_back(Queued{std::move(msg), seq});
  if (slot.running || slot.requests.size() != 1) return;  // it runs when the slot's turn comes
  MarkReady(id, slot);
  ready_cv_.notify_one();
}

void RequestScheduler::MarkReady(const SlotId& id, const SlotQueue& slot) {
  const Queued& next = slot.requests.front();
  ready_.emplace(-static_cast<int>(next.msg.header.priority), next.seq, id);
}

void RequestScheduler::Finish(const SlotId& id, uint64_t seq, size_t bytes) {
  outstanding_.erase(seq);
  queued_bytes_ -= bytes;
  SlotQueue& slot = slots_[id];
  slot.running = false;
  if (slot.requests.empty()) {
    slots_.erase(id);
  } else {
    MarkReady(id, slot);
    ready_cv_.notify_one();
  }
  done_cv_.notify_all();
}

bool RequestScheduler::Fence(Duration timeout) {
  if (threads_.empty() || running_a_request) return true;
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t fence = next_seq_;
  const auto passed = [&] {
    return stop_ || outstanding_.empty() || *outstanding_.begin() >= fence;
  };
  if (done_cv_.wait_for(lock, timeout, passed)) return true;
  DTRAIN_LOG(kWarning) << outstanding_.size() << " data request(s) still not applied after "
                       << Seconds(timeout) << " s; going on without them";
  return false;
}

size_t RequestScheduler::outstanding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outstanding_.size();
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
    request.msg = {};  // what the handler left of it goes before it stops counting
    lock.lock();
    Finish(id, request.seq, bytes);
  }
}

}  // namespace dtrain::ps

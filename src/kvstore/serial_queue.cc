#include "kvstore/serial_queue.h"

#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain {

SerialQueue::SerialQueue(std::string name) : name_(std::move(name)), thread_([this] { Loop(); }) {}

SerialQueue::~SerialQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  posted_.notify_all();
  thread_.join();
}

void SerialQueue::Post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  posted_.notify_one();
}

bool SerialQueue::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return jobs_.empty() && !running_;
}

void SerialQueue::Drain(Duration timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!drained_.wait_for(lock, timeout, [this] { return jobs_.empty() && !running_; })) {
    throw TimeoutError(name_ + ": " + std::to_string(jobs_.size() + (running_ ? 1 : 0)) +
                       " queued job(s) still outstanding after " +
                       std::to_string(Seconds(timeout)) + " s");
  }
}

void SerialQueue::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    posted_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopped, and nothing is left to run
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    running_ = true;
    lock.unlock();
    try {
      job();
    } catch (const std::exception& e) {
      DTRAIN_LOG(kError) << name_ << ": " << e.what();
    } catch (...) {
      DTRAIN_LOG(kError) << name_ << ": a job failed with an unknown exception";
    }
    job = nullptr;  // what it holds is released before the queue counts as drained
    lock.lock();
    running_ = false;
    if (jobs_.empty()) drained_.notify_all();
  }
}

}  // namespace dtrain

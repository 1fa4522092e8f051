// SerialQueue: one thread that runs jobs in the order they were posted, for work that must keep
// its callers' order without holding them up (the staging of GPU values in src/kvstore: a push
// waits there for its copy to the host, not in autograd's hook).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "dtrain/common/deadline.h"

namespace dtrain {

class SerialQueue {
 public:
  // `name` says whose thread it is in the log (a job that throws is logged under it).
  explicit SerialQueue(std::string name);
  // Runs the jobs already posted, then ends the thread.
  ~SerialQueue();
  SerialQueue(const SerialQueue&) = delete;
  SerialQueue& operator=(const SerialQueue&) = delete;

  // Jobs should not throw: one that does is logged and dropped, and the next one runs.
  void Post(std::function<void()> job);
  // No job is queued or running.
  bool idle() const;
  // Waits until no job is queued or running; TimeoutError past `timeout`, naming the queue.
  void Drain(Duration timeout) const;
  // The caller is this queue's thread (a job, or a callback a job runs): Drain could not return.
  bool OnItsThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Loop();

  const std::string name_;
  mutable std::mutex mutex_;
  std::condition_variable posted_;
  mutable std::condition_variable drained_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false;  // a job is being run
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace dtrain

// A fixed set of threads for splitting one big loop (summing a big array) into pieces.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dtrain {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();

  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs fn(begin, end) over [0, n) split into size() contiguous ranges, using the calling thread
  // as one of the workers, and returns when all are done. A call that finds the pool busy with
  // another thread's runs fn(0, n) on its own thread instead of waiting: a server applies several
  // slots at once (ps/request_scheduler.h), and waiting made their updates one after another. An
  // exception from any piece is rethrown here, once every piece has ended (the first one thrown;
  // the others are dropped), never in a pool thread.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void Loop(int index);

  std::vector<std::thread> threads_;
  std::mutex call_mutex_;  // held by the one ParallelFor that uses the pool
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr failure_;  // the first exception of a pool thread in this call
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace dtrain

#include "ps/thread_pool.h"

namespace dtrain {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) threads_.emplace_back([this, i] { Loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

static void RangeOf(int64_t n, int parts, int index, int64_t* begin, int64_t* end) {
  *begin = n * index / parts;
  *end = n * (index + 1) / parts;
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  // No pool, nothing to split, or the pool busy with another caller's loop: this thread alone.
  std::unique_lock<std::mutex> call(call_mutex_, std::defer_lock);
  if (threads_.empty() || n < 2 || !call.try_lock()) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    n_ = n;
    pending_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  int64_t begin, end;
  RangeOf(n, size(), 0, &begin, &end);
  std::exception_ptr mine;
  try {
    fn(begin, end);
  } catch (...) {
    mine = std::current_exception();
  }
  // Even when our piece threw, the others still use `fn`: wait for them before returning.
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
  std::exception_ptr failure = mine ? mine : failure_;
  failure_ = nullptr;
  if (failure) std::rethrow_exception(failure);
}

void ThreadPool::Loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
    }
    int64_t begin, end;
    RangeOf(n, size(), index, &begin, &end);
    std::exception_ptr failure;
    try {
      (*fn)(begin, end);
    } catch (...) {
      failure = std::current_exception();  // rethrown by ParallelFor in its caller's thread
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure && !failure_) failure_ = failure;
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

}  // namespace dtrain

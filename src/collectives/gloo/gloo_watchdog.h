// GlooWatchdog: gets a gloo call unstuck when a rank it waits on has died.
//
// Gloo notices a dead peer when its socket closes, and fails the waits of that pair, but not all
// of them: a send already queued behind an EPIPE, or a receive whose data was half read, waits on
// until the operation timeout (DTRAIN_COLLECTIVE_TIMEOUT_MS, minutes). So while a gloo call has run
// for longer than a moment, this thread asks (every few hundred milliseconds) whether a rank left
// the job; if one did, it aborts the waits of the call's buffers, which makes the call return, and
// tells the listener (the engine, which fails its handles at once even if gloo stays stuck
// elsewhere).
//
// Thread-safe. The buffers given to Watch must outlive the returned Call.
#pragma once

#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::collectives {

class GlooWatchdog {
 public:
  // `who_left`: "rank 2 (host) left the job", or "" when every rank is there; called on the
  // watchdog's thread. `on_lost`: called once per loss found, on the watchdog's thread.
  GlooWatchdog(std::function<std::string()> who_left,
               std::function<void(const std::string&)> on_lost);
  ~GlooWatchdog();

  GlooWatchdog(const GlooWatchdog&) = delete;
  GlooWatchdog& operator=(const GlooWatchdog&) = delete;

  // A gloo call in progress, from construction to destruction. A null watchdog watches nothing.
  class Call {
   public:
    // `abort`, if given, also releases the call's waits (a call whose buffers gloo keeps to
    // itself: the class-based algorithms'); run on the watchdog's thread.
    Call(GlooWatchdog* watchdog, std::vector<gloo::transport::UnboundBuffer*> buffers,
         std::function<void()> abort = {});
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    GlooWatchdog* watchdog_;
  };

  // What the watchdog found during the last call ("" if nothing): the call's result is not to be
  // trusted then, even if it returned normally.
  std::string found() const;

  // How long a call runs before the watchdog starts asking, and how often it asks then.
  static constexpr std::chrono::milliseconds kQuietPeriod{250};
  static constexpr std::chrono::milliseconds kAskEvery{250};

 private:
  void Run();

  const std::function<std::string()> who_left_;
  const std::function<void(const std::string&)> on_lost_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool active_ = false;
  uint64_t call_ = 0;  // number of the current or last call
  std::chrono::steady_clock::time_point started_;
  std::vector<gloo::transport::UnboundBuffer*> buffers_;
  std::function<void()> abort_;
  std::string found_;
  std::thread thread_;
};

}  // namespace dtrain::collectives

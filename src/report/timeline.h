// A timeline of what a process does, in Chrome's trace format (chrome://tracing, Perfetto), as
// Horovod's HOROVOD_TIMELINE: DTRAIN_TIMELINE=FILE (or HOROVOD_TIMELINE=FILE) turns it on.
//
// Under `dtrain launch` the events go to the launcher with the job's reports (report/reporter.h),
// which merges every process's into FILE, clocks aligned to its own; a process started by hand,
// or that cannot reach the launcher, writes FILE.<role>-<rank>.json itself when it exits.
//
// What is recorded (category / name, args):
//   train / forward, backward, step, wait_weights   a worker's iteration ("step": n)
//   kvstore / push, pull, pushpull                  a key's exchange, from the call to its end
//                                                   ("key", "bytes")
//   server / merge, apply                           a push summed into a round, a round applied
//   collectives / negotiate, fusion_copy, allreduce, allgather, broadcast   (fusion_copy: a fused
//                                                   batch through the fusion buffer, where it
//                                                   cannot go straight: across hosts, compressed,
//                                                   Adasum)
//
// Off, a span costs one load of a cached flag; on, two clock reads, its arguments rendered as text
// and an append under a mutex; the events travel to the launcher as JSON text it does not parse
// (docs/performance.md measures the cost).
//
// Threads: any.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain::timeline {

using TimePoint = std::chrono::system_clock::time_point;

// Whether events are being recorded: DTRAIN_TIMELINE or HOROVOD_TIMELINE is set, or Start was
// called and Stop not yet.
bool Enabled();

// Horovod's start_timeline/stop_timeline: records from now into `path`, which Stop (or the exit)
// writes as a whole trace, on this process's clock. InvalidArgument when the timeline is on
// already (the environment's, or an earlier Start not stopped). Stop without Start does nothing.
void Start(const std::string& path);
void Stop();

inline TimePoint Now() { return std::chrono::system_clock::now(); }

// An event's arguments, rendered as JSON members as they are added: Args().Int("step", 3).
class Args {
 public:
  Args& Int(const char* name, int64_t value);
  Args& Str(const char* name, std::string_view value);
  const std::string& text() const { return text_; }

 private:
  void Name(const char* name);
  std::string text_;  // "\"step\":3,\"key\":\"w\""
};

// A complete event [begin, end) on the calling thread. `name` and `category` must live as long as
// the process (string literals).
void Complete(const char* name, const char* category, TimePoint begin, TimePoint end,
              Args args = {});

// A span from construction to destruction; nothing at all when the timeline is off (build the
// Args only when Enabled()).
class Span {
 public:
  Span(const char* name, const char* category, Args args = {})
      : on_(Enabled()), name_(name), category_(category) {
    if (on_) {
      args_ = std::move(args);
      begin_ = Now();
    }
  }
  ~Span() {
    if (on_) Complete(name_, category_, begin_, Now(), std::move(args_));
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  const char* name_;
  const char* category_;
  Args args_;
  TimePoint begin_;
};

}  // namespace dtrain::timeline

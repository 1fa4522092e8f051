// A point in time by which a blocking wait must end.
#pragma once

#include <chrono>

namespace dtrain {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

class Deadline {
 public:
  explicit Deadline(Duration timeout) : at_(Clock::now() + timeout), timeout_(timeout) {}

  Clock::time_point at() const { return at_; }
  Duration timeout() const { return timeout_; }
  bool passed() const { return Clock::now() >= at_; }
  Duration left() const {
    auto d = std::chrono::duration_cast<Duration>(at_ - Clock::now());
    return d.count() > 0 ? d : Duration(0);
  }

 private:
  Clock::time_point at_;
  Duration timeout_;
};

// "12.5 s" style text for messages.
inline double Seconds(Duration d) { return static_cast<double>(d.count()) / 1000.0; }

}  // namespace dtrain

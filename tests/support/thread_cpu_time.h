// Shared by the unit tests of every module: the CPU time the calling thread has used, to tell a
// wait that polls from one that sleeps.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace dtrain::test_support {

inline std::chrono::microseconds ThreadCpuTime() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::chrono::microseconds(int64_t{t.tv_sec} * 1000000 + t.tv_nsec / 1000);
}

}  // namespace dtrain::test_support

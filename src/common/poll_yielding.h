// Polls a condition another thread makes true, yielding the core between looks, until a time:
// the first phase of a wait that then sleeps (collectives' Handle::Wait, the KVStore's
// OperationState::Wait). A thread that sleeps at once leaves its core idle, and an idle core is
// slow to wake when the result comes (collectives/engine/engine.cc, SpinWaitFor, says how slow).
// Yielding hands the core to any thread that wants it meanwhile.
#pragma once

#include <sched.h>

#include <mutex>

#include "dtrain/common/deadline.h"

namespace dtrain {

// Returns once `done()`, checked under `mutex`, is true (true) or `until` has passed (false).
// Between looks it calls `work()`, which may do some of what is waited for itself, and yields
// the core when that did nothing (returned false).
template <class Done, class Work>
bool PollYielding(std::mutex& mutex, Clock::time_point until, Done done, Work work) {
  while (Clock::now() < until) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (done()) return true;
    }
    if (!work()) sched_yield();
  }
  return false;
}

template <class Done>
bool PollYielding(std::mutex& mutex, Clock::time_point until, Done done) {
  return PollYielding(mutex, until, done, [] { return false; });
}

}  // namespace dtrain

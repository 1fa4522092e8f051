// The engine's rounds: one round (RunRound), the background thread that runs them at the cycle's
// pace (Run), and a waiting caller that runs the round due itself (HelpWithRound).
//
// Any thread may run a round, one at a time (round_mutex): rounds are allgathers among the ranks,
// which pair up by count, not by thread. A caller polling for its handle (Handle::Wait) runs the
// round its submission made due: on a host with no core to spare, handing the round to the engine
// thread meant a wake-up and a switch on a busy core at each end of it, which cost 0.2-0.3 ms of
// a 3 ms LeNet step (docs/performance.md, "A waiting caller runs the round").
#include <algorithm>
#include <iterator>
#include <utility>

#include "collectives/engine/engine_impl.h"
#include "collectives/error_text.h"
#include "common/logging.h"
#include "report/timeline.h"

namespace dtrain::collectives {
namespace {

// An idle engine (nothing pending on any rank) runs a round only every kIdleCycle, or as soon as
// something is submitted: every round is an allgather, and MPI's spin while they wait for a peer,
// which would take the CPU from the training between steps. Every rank sees the same rounds, so
// all go idle together; a rank that submits first waits in its round until the others submit too
// (or their idle cycle ends, which bounds how late a stall check can run).
constexpr std::chrono::microseconds kIdleCycle(20000);

}  // namespace

bool Engine::Impl::RoundDue() const {
  return !queue.empty() || announce_join || Clock::now() >= next_cycle;
}

void Engine::Impl::Run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      // next_cycle moves when a caller runs a round: look again at each wake-up.
      while (!stopped && !RoundDue()) wake.wait_until(lock, next_cycle);
      if (stopped) break;
    }
    std::lock_guard<std::mutex> round(round_mutex);
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopped) break;
      if (!RoundDue()) continue;  // a waiting caller ran it meanwhile
    }
    if (!RunRound()) break;
  }
  std::lock_guard<std::mutex> round(round_mutex);
  // Whatever is left was not submitted by every rank before they all shut down.
  std::vector<Request> left;
  {
    std::lock_guard<std::mutex> lock(mutex);
    left = TakeUnannounced();
  }
  for (auto& [name, r] : pending) left.push_back(std::move(r));
  pending.clear();
  CompleteJoin(
      Failure{ErrorKind::kOther, "the collectives were shut down before every rank joined"}.For(
          "join"));
  for (auto& r : left) {
    const auto missing = table.MissingRanks(r.name);
    Finish(r, Failure{ErrorKind::kOther,
                      "the collectives were shut down before " +
                          (missing.empty() ? std::string("every rank") : RankList(missing)) +
                          " submitted it"}
                  .For(r.state->what));
  }
  nccl.reset();  // on this thread, which made it
  {
    std::lock_guard<std::mutex> lock(mutex);
    finished = true;
  }
  finished_cv.notify_all();
}

namespace {
// The engine whose round this thread is running: a completion callback run within the round
// that waits for another handle must not run a round of that engine again.
thread_local const Engine::Impl* running_round_of = nullptr;
}  // namespace

bool Engine::Impl::HelpWithRound() {
  // Not where the backend's waits poll without a deadline (MPI across hosts): the caller would
  // spin there, past its own deadline, for a rank that may never come. Not once CUDA collectives
  // are about: NCCL's communicator stays on the engine thread.
  if (running_round_of == this || !backend->WaitsSleep() || device_seen.load()) return false;
  std::unique_lock<std::mutex> round(round_mutex, std::try_to_lock);
  if (!round.owns_lock()) return false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopped || device_seen.load() || nccl || !RoundDue()) return false;
  }
  caller_rounds.fetch_add(1, std::memory_order_relaxed);
  running_round_of = this;
  const bool going_on = RunRound();
  running_round_of = nullptr;
  if (!going_on) wake.notify_all();  // the engine thread ends the engine
  return true;
}

bool Engine::Impl::RunRound() {
  // A failed round ends the engine: no more rounds, every handle failed with the reason.
  const auto stop = [this](const Failure& f) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopped = true;
    }
    DTRAIN_LOG(kError) << "collectives: " << f.message;
    try {
      FailAll(f);
    } catch (...) {  // a completion callback's; the handles are failed all the same
    }
    return false;
  };
  try {
    std::vector<Request> fresh;
    bool shutting_down = false;
    bool joined = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      fresh.assign(std::make_move_iterator(queue.begin()), std::make_move_iterator(queue.end()));
      queue.clear();
      joined = std::exchange(announce_join, false);
      shutting_down = shutdown_requested;
      if (shutting_down && Clock::now() >= shutdown_deadline) {
        DTRAIN_LOG(kWarning) << "collectives: gave up waiting for " << RankList(not_shutting_down)
                             << " to shut down the collectives too; leaving without them";
        for (auto& r : fresh) pending.emplace(r.name, std::move(r));
        stopped = true;
        return false;
      }
    }
    const Clock::time_point now = Clock::now();
    RoundMessage mine;
    mine.shutting_down = shutting_down;
    mine.joined = joined;
    mine.stuck = fresh.empty() && StuckVote(now);
    mine.tuned = std::exchange(announce_tuned, std::nullopt);
    for (auto& r : fresh) {
      table.Announce(rank, r.name, r.desc, &mine);
      std::string name = r.name;
      pending.emplace(std::move(name), std::move(r));
    }
    std::vector<RoundMessage> round;
    {
      timeline::Span span("negotiate", "collectives");
      round = Exchange(mine);
    }
    rounds.fetch_add(1, std::memory_order_relaxed);
    if (round[0].tuned) tuned = *round[0].tuned;
    const bool quiet =
        std::all_of(round.begin(), round.end(), [](const RoundMessage& m) { return m.empty(); });
    auto ready = table.Apply(round, now);
    if (!quiet || !ready.empty() || !runnable.empty()) last_progress = Clock::now();
    if (!ready.empty() || !runnable.empty()) Execute(ready);
    if (autotuner) announce_tuned = autotuner->EndRound();
    FailDeadlock(round, now);
    if (const auto last = table.TakeJoinCompleted()) CompleteJoin(nullptr, *last);
    FailWhatShutDownRanksMiss(round);
    // When to start the next round (a submission starts one sooner, see Submit):
    //  - right away while allreduces are left to run (every rank has the same left, so all
    //    come back at once);
    //  - right away while this rank has submitted every pending collective and waits for
    //    other ranks to submit theirs, where the backend's waits sleep: it waits for them
    //    inside the round. Otherwise a late rank whose submission came while it sat in a round
    //    (its message went out empty) started its next round at once and found the others
    //    asleep for a cycle: a tiny allreduce a step on one host waited over 1.2 ms one time
    //    in ten. A rank late for something sleeps as before, so the rounds go at the late
    //    ranks' pace. A rank that has joined (Horovod's join) has nothing left to submit and
    //    waits for the others the same way. Not where a wait polls (MPI across hosts): it
    //    would take the training's core; a joined rank there comes back a cycle after a round
    //    that moved;
    //  - after a cycle while collectives are pending (a rank is late). Not right away: on a
    //    busy host each round takes CPU from the training, and a late rank's submission
    //    starts its round at once anyway (one-host LeNet over Gloo trained 7% faster than
    //    with an immediate round);
    //  - after kIdleCycle with nothing pending, even after a round that ran something: rounds
    //    then only serve a late rank's stall check and shutdown, and the CPU belongs to the
    //    training. (A round one cycle after each run would open in the middle of the next
    //    step and meet its first submission with an empty message: the late rank above.)
    const bool joined_here = table.HasJoined(rank);
    const bool only_others_late = joined_here || (table.pending() > 0 && !table.Lacks(rank));
    Clock::time_point next;
    if (!runnable.empty() || (only_others_late && backend->WaitsSleep())) {
      next = now;
    } else if (table.pending() > 0 || (joined_here && !quiet)) {
      next = now + tuned.cycle_time;
    } else {
      next = now + std::max<std::chrono::microseconds>(tuned.cycle_time, kIdleCycle);
    }
    Monitor(now);
    not_shutting_down.clear();
    for (int r = 0; r < size; ++r) {
      if (!round[r].shutting_down) not_shutting_down.push_back(r);
    }
    std::lock_guard<std::mutex> lock(mutex);
    // A caller's round may make the next one due sooner than the engine thread, asleep until the
    // old time, expects; the caller may not run it (its handle is done, or it stopped polling).
    if (next < next_cycle) wake.notify_one();
    next_cycle = next;
    if (not_shutting_down.empty() && runnable.empty()) stopped = true;
    return !stopped;
  } catch (const std::exception& e) {
    return stop(Failure::From(e));
  } catch (...) {
    return stop(
        Failure{ErrorKind::kOther, "the collectives engine failed with an unknown exception"});
  }
}

}  // namespace dtrain::collectives

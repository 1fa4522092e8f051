// What the engine does about collectives that wait for some ranks: each handle learns whom it
// waits for, rank 0 warns of stalls (Horovod's stall check), and ranks that all wait for each
// other's collectives fail them as a deadlock (the vote in each round message; docs/design.md,
// "Allreduce mode"). Part of Engine::Impl (engine_impl.h), run within rounds.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/engine/engine_impl.h"
#include "collectives/error_text.h"
#include "common/logging.h"

namespace dtrain::collectives {
namespace {

// How often pending handles learn which ranks they wait for (for their TimeoutError).
constexpr Duration kDescribeEvery(200);
constexpr size_t kMaxNamesInWarning = 20;

}  // namespace

void Engine::Impl::Monitor(Clock::time_point now) {
  if (!pending.empty() && now - last_describe >= kDescribeEvery) {
    last_describe = now;
    for (auto& [name, r] : pending) {
      const auto missing = table.MissingRanks(name);
      std::lock_guard<std::mutex> lock(r.state->mutex);
      r.state->waiting_for = missing.empty() ? "" : RankList(missing);
    }
  }
  // Rank 0 warns for the job, as Horovod's coordinator does; every rank knows the same.
  if (rank != 0 || config.stall_warning.count() == 0 ||
      now - last_stall_check < config.stall_warning) {
    return;
  }
  last_stall_check = now;
  const auto waiting = table.Waiting(now, config.stall_warning);
  if (waiting.empty()) return;
  std::ostringstream out;
  out << "collectives stalled: " << waiting.size()
      << " collective(s) submitted by some ranks have waited more than "
      << SecondsText(config.stall_warning) << " (DTRAIN_STALL_WARNING_S) for the others:";
  for (size_t i = 0; i < waiting.size() && i < kMaxNamesInWarning; ++i) {
    out << (i ? ";" : "") << " '" << waiting[i].name << "' waits for "
        << RankList(waiting[i].missing_ranks) << " (" << SecondsText(waiting[i].waiting) << ")";
  }
  if (waiting.size() > kMaxNamesInWarning)
    out << "; and " << waiting.size() - kMaxNamesInWarning << " more";
  out << ". Every rank must submit the same collectives; the missing ranks may be stuck or slow.";
  DTRAIN_LOG(kWarning) << out.str();
}

bool Engine::Impl::StuckVote(Clock::time_point now) const {
  // Waiting threads on this rank, each for a collective of its own that is not ready (every one
  // this rank has pending lacks some rank's submission: a ready one runs in its round), and no
  // rank has submitted anything, nor has anything run, for the grace time.
  return config.deadlock_grace.count() > 0 && !pending.empty() && runnable.empty() &&
         waiters->load() > 0 && now - last_progress >= config.deadlock_grace;
}

void Engine::Impl::FailDeadlock(const std::vector<RoundMessage>& round, Clock::time_point now) {
  const bool everyone =
      std::all_of(round.begin(), round.end(), [](const RoundMessage& m) { return m.stuck; });
  if (!everyone) return;
  // Every rank decides this in the same round from the same messages, so every table drops the
  // same collectives and every rank fails its own with the same text.
  const auto dropped = table.DropPending(now);
  std::ostringstream out;
  out << "deadlock: every rank has waited " << SecondsText(config.deadlock_grace)
      << " (DTRAIN_DEADLOCK_MS) for a collective that some other rank has not submitted, and "
         "none can run:";
  for (size_t i = 0; i < dropped.size() && i < kMaxNamesInWarning; ++i) {
    std::vector<int> submitted;
    for (int r = 0; r < size; ++r) {
      if (std::find(dropped[i].missing_ranks.begin(), dropped[i].missing_ranks.end(), r) ==
          dropped[i].missing_ranks.end()) {
        submitted.push_back(r);
      }
    }
    out << (i ? ";" : "") << " '" << dropped[i].name << "' submitted by " << RankList(submitted)
        << ", not by " << RankList(dropped[i].missing_ranks);
  }
  if (dropped.size() > kMaxNamesInWarning)
    out << "; and " << dropped.size() - kMaxNamesInWarning << " more";
  out << ". Every rank must submit the same collectives (an error on one rank, such as a failed "
         "check, often leaves the others waiting for what it never submits)";
  const std::string text = out.str();
  if (rank == 0) DTRAIN_LOG(kError) << "collectives: " << text;
  std::vector<std::string> names;
  for (const auto& [name, r] : pending) names.push_back(name);
  for (const auto& name : names) {
    Request& r = pending.at(name);
    Finish(r, Failure{ErrorKind::kInvalid, text}.For(r.state->what));
  }
  last_progress = Clock::now();
}

}  // namespace dtrain::collectives

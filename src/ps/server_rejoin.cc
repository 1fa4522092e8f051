// Server: a lost worker's replacement (the model is in server.h): where its rank resumes, what
// its lost process left behind, and the rounds that complete without pushes lost with a server.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <shared_mutex>

#include "common/logging.h"
#include "ps/server.h"
#include "ps/server_slot.h"
#include "report/reporter.h"

namespace dtrain::ps {

using transport::Command;
using transport::Header;
using transport::Message;

void Server::HandleRejoinCommand(const Message& msg, const std::string& cmd, int64_t round) {
  const Header& h = msg.header;
  if (!node_.layout().IsWorker(h.sender)) return ReplyError(h, "only workers rejoin");
  const int worker = node_.layout().RankOf(h.sender);
  std::set<int64_t> counts;
  // [key, part, rounds pushed] per slot: a dist_async slot's pushes count as its rounds.
  nlohmann::json pushed = nlohmann::json::array();
  int64_t slots = 0;
  {
    std::shared_lock<std::shared_mutex> lock(slots_mutex_);
    for (auto& [id, slot] : slots_) {
      std::lock_guard<std::mutex> slot_lock(slot->mutex);
      ++slots;
      int64_t& contributed = slot->contributed[worker];
      if (cmd == "rejoin_state") {
        counts.insert(contributed);
        pushed.push_back({slot->key, slot->part, contributed});
      } else if (contributed > round) {
        slot->absorb[worker] = contributed - round;
        contributed = round;
      } else if (contributed < round && slot->sync) {
        slot->resume_at[worker] = round;  // decided at its first push (DecideLostRounds)
      } else if (contributed < round) {
        // No round waits for them: the pushes are simply gone with both processes.
        DTRAIN_LOG(kWarning) << "worker " << worker << "'s pushes " << contributed + 1 << "-"
                             << round << " into " << SlotName(slot->key, slot->part)
                             << " were lost with its process and this server's";
        contributed = round;
      }
    }
  }
  if (cmd == "rejoin") {
    DTRAIN_LOG(kConnections) << node_.NameOf(h.sender) << " resumes at round " << round;
    return Reply(h);
  }
  Reply(h, {}, nlohmann::json{{"counts", counts}, {"slots", slots}, {"pushed", pushed}}.dump());
}

void Server::OnWorkerReplaced(int worker_rank) {
  scheduler_.Fence(scheduler_wait_);  // the lost process's requests received before go first
  const NodeId lost = node_.layout().WorkerId(worker_rank);
  std::shared_lock<std::shared_mutex> lock(slots_mutex_);
  for (auto& [id, slot] : slots_) {
    std::lock_guard<std::mutex> slot_lock(slot->mutex);
    // Its push stays in the round (pushed, merged); only the answers it waited for go.
    std::erase_if(slot->waiting, [lost](const Header& w) { return w.sender == lost; });
    slot->deferred[worker_rank].clear();
    slot->absorb[worker_rank] = 0;
    slot->resume_at[worker_rank] = -1;
    slot->skip[worker_rank] = 0;
  }
  std::lock_guard<std::mutex> reported(lost_rounds_mutex_);
  lost_rounds_reported_.erase(worker_rank);
}

void Server::OnWorkerLost(int /*worker_rank*/) {
  scheduler_.Fence(scheduler_wait_);  // the checkpoint holds what it pushed before
  if (!checkpoint_folder_.empty()) RequestCheckpoint();
}

void Server::DecideLostRounds(SlotState& slot, int worker) {
  if (slot.resume_at[worker] < 0) return;
  // The rounds the other workers have pushed (or queued) beyond this rank's: those its lost
  // process had pushed, up to where its replacement resumes.
  int64_t others = 0;
  for (size_t w = 0; w < slot.contributed.size(); ++w) {
    if (static_cast<int>(w) == worker) continue;
    int64_t pushes = 0;
    for (const Message& m : slot.deferred[w]) pushes += m.header.command != Command::kPull;
    others = std::max(others, slot.contributed[w] + pushes);
  }
  const int64_t lost = std::min(slot.resume_at[worker], others) - slot.contributed[worker];
  slot.resume_at[worker] = -1;
  if (lost > 0) {
    slot.skip[worker] = lost;
    DTRAIN_LOG(kWarning) << "worker " << worker << "'s pushes of rounds "
                         << slot.contributed[worker] + 1 << "-" << slot.contributed[worker] + lost
                         << " of " << SlotName(slot.key, slot.part)
                         << " were lost with its process and this server's: those rounds "
                            "complete without them";
    std::lock_guard<std::mutex> reported(lost_rounds_mutex_);
    if (lost_rounds_reported_.insert(worker).second) {
      // The launcher lists them with the worker's restart (status page, summary).
      report::Send({{"kind", "rounds_lost"},
                    {"worker", worker},
                    {"first", slot.contributed[worker] + 1},
                    {"last", slot.contributed[worker] + lost}});
    }
  }
}

void Server::SkipLostRounds(SlotState& slot) {
  for (size_t w = 0; w < slot.skip.size(); ++w) {
    if (slot.skip[w] > 0 && !slot.pushed[w]) {
      --slot.skip[w];
      slot.pushed[w] = 1;
      ++slot.pushed_count;
      ++slot.contributed[w];
    }
  }
}

}  // namespace dtrain::ps

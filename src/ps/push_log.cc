#include "ps/push_log.h"

#include <algorithm>

#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain::ps {

PushLog::PushLog(size_t bound_bytes, int num_servers)
    : fixed_bound_(bound_bytes),
      server_bytes_(num_servers, 0),
      asked_(num_servers, 0),
      recorded_(num_servers, 0),
      heard_(num_servers, 0) {}

PushLog::Recorded PushLog::Record(int server, uint64_t request_id, const transport::Message& push) {
  SlotLog& log = slots_[{push.header.key, push.header.part}];
  log.server = server;
  recorded_[server] = 1;
  Entry entry{++log.pushed, request_id, push};
  entry.push.header.command = transport::Command::kPush;  // repeated, it needs no answer value
  const size_t size = push.body.size;
  round_bytes_ += size - log.push_bytes;  // unsigned wrap-around cancels out
  log.push_bytes = size;
  log.entries.push_back(std::move(entry));
  server_bytes_[server] += size;
  total_ += size;
  const size_t bound = this->bound();
  while (total_ > bound && log.entries.size() > 1) Drop(log);
  Recorded out{log.pushed, false, heard_[server]};
  const size_t share = bound / (2 * server_bytes_.size());
  if (server_bytes_[server] > share && !asked_[server]) {
    asked_[server] = 1;
    out.ask_for_checkpoint = true;
  }
  return out;
}

size_t PushLog::bound() const {
  if (fixed_bound_ > 0) return fixed_bound_;
  return std::clamp(kAutoRounds * round_bytes_, kAutoMinBytes, kAutoMaxBytes);
}

void PushLog::Drop(SlotLog& log) {
  const Entry& oldest = log.entries.front();
  if (log.dropped_through == 0) {
    DTRAIN_LOG(kWarning) << "the replay log is full (DTRAIN_REPLAY_LOG_MB): dropping pushes of key "
                         << oldest.push.header.key << " from round " << oldest.round
                         << "; its server cannot be restored until its next checkpoint";
  }
  log.dropped_through = oldest.round;
  server_bytes_[log.server] -= oldest.push.body.size;
  total_ -= oldest.push.body.size;
  log.entries.pop_front();
}

void PushLog::StartAt(int server, SlotId slot, int64_t rounds) {
  SlotLog& log = slots_[slot];
  log.server = server;
  log.pushed = rounds;
  log.dropped_through = rounds;  // the lost process's pushes were never here
}

void PushLog::Trim(int server, SlotId slot, int64_t rounds) {
  auto it = slots_.find(slot);
  if (it == slots_.end() || it->second.server != server) return;
  SlotLog& log = it->second;
  while (!log.entries.empty() && log.entries.front().round <= rounds) {
    server_bytes_[server] -= log.entries.front().push.body.size;
    total_ -= log.entries.front().push.body.size;
    log.entries.pop_front();
  }
}

void PushLog::CheckpointAnswered(int server, uint64_t checkpoint) {
  if (server < 0 || static_cast<size_t>(server) >= asked_.size()) return;
  asked_[server] = 0;
  heard_[server] = checkpoint;
}

std::vector<PushLog::Entry> PushLog::Since(int server,
                                           const std::map<SlotId, int64_t>& restored) const {
  std::vector<Entry> out;
  for (const auto& [slot, log] : slots_) {
    if (log.server != server) continue;
    auto it = restored.find(slot);
    const int64_t from = it == restored.end() ? 0 : it->second;
    if (from < log.dropped_through) {
      throw PeerError("server " + std::to_string(server) + " restored key " +
                      std::to_string(slot.first) + " at round " + std::to_string(from) +
                      ", but this worker kept its pushes from round " +
                      std::to_string(log.dropped_through + 1) +
                      " only (DTRAIN_REPLAY_LOG_MB): the rounds between are lost");
    }
    for (const Entry& e : log.entries) {
      if (e.round > from) out.push_back(e);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.request_id < b.request_id; });
  return out;
}

int64_t PushLog::pushed(SlotId slot) const {
  auto it = slots_.find(slot);
  return it == slots_.end() ? 0 : it->second.pushed;
}

}  // namespace dtrain::ps

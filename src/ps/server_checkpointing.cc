// Server: its checkpoints and their restoration (the model is in server.h).
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <shared_mutex>

#include "common/logging.h"
#include "dtrain/common/deadline.h"
#include "dtrain/common/error.h"
#include "ps/server.h"
#include "ps/server_slot.h"
#include "report/reporter.h"
#include "report/timeline.h"

namespace dtrain::ps {
namespace {

// This thread's CPU time so far, in milliseconds.
double ThreadCpuMs() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// What `worker` had pushed into each slot (the rounds of dist_sync slots, its own pushes into
// dist_async ones), as workers are told after a checkpoint and by a restored server.
std::vector<SlotRounds> PushedBy(const std::vector<CheckpointSlot>& slots, int worker) {
  std::vector<SlotRounds> out;
  out.reserve(slots.size());
  for (const CheckpointSlot& c : slots) out.push_back({c.key, c.part, c.PushedBy(worker)});
  return out;
}

}  // namespace

using transport::Command;
using transport::Message;

void Server::OnJoined() {
  if (config_.checkpoint_dir.empty()) {
    if (node_.rejoined()) {
      throw ConfigError(
          "this server replaces a lost one but has no DTRAIN_CHECKPOINT_DIR to "
          "restore it from");
    }
    return;
  }
  checkpoint_folder_ = CheckpointFolder(config_.checkpoint_dir, node_.self().rank);
  if (node_.rejoined()) {
    std::optional<ServerCheckpoint> checkpoint = ReadCheckpoint(checkpoint_folder_);
    if (!checkpoint) {
      throw Error("server " + std::to_string(node_.self().rank) +
                  " cannot be restored: no checkpoint in " + checkpoint_folder_ +
                  " (every server writes one when it joins: is DTRAIN_CHECKPOINT_DIR the same "
                  "folder as the lost server's, on this host?)");
    }
    Restore(*checkpoint);
  } else {
    RemoveCheckpoint(checkpoint_folder_);  // an earlier job's, never to be restored into this one
    WriteAndAnnounce(/*announce=*/false);  // empty: even a server with no slots can be restored
  }
  checkpoint_thread_ = std::thread([this] { CheckpointLoop(); });
}

void Server::Restore(const ServerCheckpoint& checkpoint) {
  if (!checkpoint.optimizer_spec.empty()) {
    InstallOptimizer(checkpoint.optimizer_spec);
    if (!checkpoint.optimizer_state.empty()) {
      std::unique_lock<std::shared_mutex> lock(optimizer_state_mutex_);
      CurrentOptimizer()->LoadState(checkpoint.optimizer_state);
    }
  }
  const int workers = node_.layout().num_workers;
  int64_t least = -1, most = 0;
  std::unique_lock<std::shared_mutex> lock(slots_mutex_);
  for (const CheckpointSlot& c : checkpoint.slots) {
    if (!c.sync && !c.pushes.empty() && c.pushes.size() != static_cast<size_t>(workers)) {
      throw Error("the checkpoint in " + checkpoint_folder_ + " counts pushes of " +
                  std::to_string(c.pushes.size()) + " workers, this job has " +
                  std::to_string(workers));
    }
    auto slot = std::make_unique<SlotState>(c.key, c.part, c.length, c.dtype, c.sync, c.value,
                                            workers, c.rounds);
    slot->row_length = c.row_length;
    for (int w = 0; w < workers; ++w) slot->contributed[w] = c.PushedBy(w);
    if (c.sync) {
      least = least < 0 ? c.rounds : std::min(least, c.rounds);
      most = std::max(most, c.rounds);
    }
    restored_slots_.push_back(c);
    restored_slots_.back().value = transport::Body{};
    slots_[{c.key, c.part}] = std::move(slot);
  }
  DTRAIN_LOG(kWarning) << "restored " << checkpoint.slots.size() << " slot(s) from "
                       << checkpoint_folder_ << " at rounds " << std::max<int64_t>(least, 0) << "-"
                       << most
                       << (least < 0 ? " (dist_async: at each worker's count of pushes)" : "")
                       << (checkpoint.optimizer_spec.empty() ? "" : ", with the optimizer's state")
                       << "; the workers repeat their pushes since";
}

void Server::HandleCheckpointCommand(const transport::Header& h, const nlohmann::json& meta,
                                     const std::string& cmd) {
  if (!node_.layout().IsWorker(h.sender)) return ReplyError(h, cmd + " is for workers");
  if (cmd == "checkpoint_now") {
    if (checkpoint_folder_.empty()) return Reply(h);
    // {"durable": true}: answered once a checkpoint taken after this request is written (a
    // replacement worker waits for it: issue 63).
    if (meta.contains("durable") && meta["durable"] == true) return AcknowledgeOnceCheckpointed(h);
    uint64_t after = 0;  // an asker that names no checkpoint gets a new one
    if (meta.contains("after")) {
      if (!meta["after"].is_number_unsigned()) return ReplyError(h, "checkpoint_now: bad 'after'");
      after = meta["after"].get<uint64_t>();
    }
    uint64_t taken = 0;
    {
      std::lock_guard<std::mutex> lock(checkpoint_mutex_);
      taken = checkpoints_taken_;
    }
    if (after > 0 && taken > after) {
      DTRAIN_LOG(kConnections) << node_.NameOf(h.sender) << " asked for a checkpoint after "
                               << after << ": checkpoint " << taken << " answers it";
    } else {
      RequestCheckpoint();
    }
    return Reply(h);
  }
  Reply(h, {}, EncodeSlotRounds(cmd, PushedBy(restored_slots_, node_.layout().RankOf(h.sender))));
}

void Server::RequestCheckpoint() {
  {
    std::lock_guard<std::mutex> lock(checkpoint_mutex_);
    checkpoint_requested_ = true;
  }
  checkpoint_cv_.notify_all();
}

void Server::AcknowledgeOnceCheckpointed(const transport::Header& request) {
  if (checkpoint_folder_.empty()) return Reply(request);
  {
    std::lock_guard<std::mutex> lock(checkpoint_mutex_);
    acknowledge_after_checkpoint_.push_back(request);
    checkpoint_requested_ = true;
  }
  checkpoint_cv_.notify_all();
}

void Server::CheckpointLoop() {
  std::unique_lock<std::mutex> lock(checkpoint_mutex_);
  while (!checkpoint_stop_) {
    checkpoint_cv_.wait_for(lock, config_.server_checkpoint_interval,
                            [this] { return checkpoint_stop_ || checkpoint_requested_; });
    if (checkpoint_stop_) return;
    const bool asked = checkpoint_requested_;
    checkpoint_requested_ = false;
    if (!asked && !pushed_since_checkpoint_.load()) continue;  // nothing changed
    lock.unlock();
    WriteAndAnnounce(/*announce=*/true);
    lock.lock();
  }
}

void Server::StopCheckpoints() {
  {
    std::lock_guard<std::mutex> lock(checkpoint_mutex_);
    checkpoint_stop_ = true;
  }
  checkpoint_cv_.notify_all();
  if (checkpoint_thread_.joinable()) checkpoint_thread_.join();
}

void Server::FinalCheckpoint() {
  if (checkpoint_folder_.empty()) return;
  StopCheckpoints();
  scheduler_.Fence(scheduler_wait_);     // everything received is in it
  WriteAndAnnounce(/*announce=*/false);  // the workers have left
}

ServerCheckpoint Server::Capture() {
  ServerCheckpoint checkpoint;
  std::shared_lock<std::shared_mutex> slots_lock(slots_mutex_);
  // Every slot at once, each between two rounds: the values and the optimizer's state agree.
  // Slot locks are otherwise taken one at a time, so taking them all in map order cannot deadlock.
  std::vector<std::unique_lock<std::mutex>> paused;
  paused.reserve(slots_.size());
  for (auto& [id, slot] : slots_) paused.emplace_back(slot->mutex);
  pushed_since_checkpoint_.store(false);
  for (auto& [id, slot] : slots_) {
    CheckpointSlot c;
    c.key = slot->key;
    c.part = slot->part;
    c.dtype = slot->dtype;
    c.length = slot->length;
    c.sync = slot->sync;
    c.rounds = slot->rounds;
    c.row_length = slot->row_length;
    if (!slot->sync) c.pushes = slot->contributed;
    c.value = slot->value;  // shared: the next update copies first (ApplyGradient)
    c.value.size = slot->bytes();
    checkpoint.slots.push_back(std::move(c));
  }
  std::shared_ptr<Optimizer> optimizer;
  {
    std::lock_guard<std::mutex> lock(optimizer_mutex_);
    checkpoint.optimizer_spec = optimizer_spec_;
    optimizer = optimizer_;
  }
  if (optimizer) {
    std::unique_lock<std::shared_mutex> lock(optimizer_state_mutex_);
    checkpoint.optimizer_state = optimizer->SaveState();
  }
  return checkpoint;
}

void Server::WriteAndAnnounce(bool announce) {
  std::lock_guard<std::mutex> write_lock(checkpoint_write_mutex_);
  const auto begin = Clock::now();
  const double cpu_begin_ms = ThreadCpuMs();
  timeline::Span span("checkpoint", "server", timeline::Args());
  // Taken before the capture: the changes they acknowledge were made before they were queued.
  std::vector<transport::Header> acknowledge;
  {
    std::lock_guard<std::mutex> lock(checkpoint_mutex_);
    acknowledge.swap(acknowledge_after_checkpoint_);
  }
  ServerCheckpoint checkpoint = Capture();
  uint64_t number = 0;
  {
    std::lock_guard<std::mutex> lock(checkpoint_mutex_);
    number = ++checkpoints_taken_;
  }
  const double paused_ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
  size_t bytes = 0;
  try {
    bytes = WriteCheckpoint(checkpoint_folder_, checkpoint);
  } catch (const std::exception& e) {
    // The previous checkpoint stays; the workers keep their pushes since (and ask again).
    DTRAIN_LOG(kWarning) << "cannot write a checkpoint: " << e.what();
    pushed_since_checkpoint_.store(true);
    {
      std::lock_guard<std::mutex> lock(checkpoint_mutex_);
      checkpoints_taken_ = number - 1;  // writes are serialised: none was taken since
    }
    for (const transport::Header& h : acknowledge) {
      ReplyError(h, std::string("the server cannot write its checkpoint: ") + e.what());
    }
    return;
  }
  for (const transport::Header& h : acknowledge) Reply(h);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
  DTRAIN_LOG(kConnections) << "checkpoint of " << checkpoint.slots.size() << " slot(s), " << bytes
                           << " bytes, written in " << ms << " ms (pushes paused " << paused_ms
                           << " ms)";
  if (announce) {
    for (int w = 0; w < node_.layout().num_workers; ++w) {
      Message notice;
      notice.header.command = Command::kCommand;
      notice.meta = EncodeSlotRounds("checkpointed", PushedBy(checkpoint.slots, w), number);
      try {
        node_.Send(node_.layout().WorkerId(w), notice);
      } catch (const Error&) {
        // A lost worker: its replacement keeps what it pushes from its start anyway.
      }
    }
  }
  // The CPU the whole checkpoint took on this thread (capture, write, notices; not the wait for
  // the disk): what checkpoints cost the server, for the job's summary.
  report::Send({{"kind", "checkpoint"},
                {"bytes", bytes},
                {"ms", ms},
                {"cpu_ms", ThreadCpuMs() - cpu_begin_ms}});
}

}  // namespace dtrain::ps

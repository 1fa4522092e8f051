#include "ps/worker_client.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "dtrain/common/error.h"
#include "ps/checkpoint_file.h"

namespace dtrain::ps {

using transport::Body;
using transport::Command;
using transport::Message;

namespace {

// The answer to a request nobody waits for any more (a push repeated to a restored server, a
// checkpoint request): only a refusal is worth a line.
WorkerClient::Done LogIfRefused(Node& node, std::string what) {
  return [&node, what](const Message*, std::exception_ptr error) {
    if (!error || node.failure()) return;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      DTRAIN_LOG(kWarning) << what << ": " << e.what();
    }
  };
}

}  // namespace

WorkerClient::WorkerClient(Node& node) : node_(node) {
  node_.SetDataHandler(
      [this](Message&& msg) { OnReply(std::move(msg)); },
      [this](const transport::Header& h, size_t bytes) { return SinkFor(h, bytes); });
  node_.AddFailureListener([this](const std::string& why) { FailAll(why); });
}

void WorkerClient::EnableReplay(size_t bound_bytes, bool log_pushes) {
  std::lock_guard<std::mutex> lock(mutex_);
  keep_requests_ = true;
  if (log_pushes) log_ = std::make_unique<PushLog>(bound_bytes, node_.layout().num_servers);
}

bool WorkerClient::LoggedPushTo(int server_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_ && log_->RecordedFor(server_rank);
}

void WorkerClient::StartLogAt(int server, uint64_t key, uint32_t part, int64_t rounds) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (log_) log_->StartAt(server, {key, part}, rounds);
}

void WorkerClient::Request(int server_rank, Message request, Body reply_into, Done done,
                           bool log_push) {
  Issue(server_rank, std::move(request), std::move(reply_into), std::move(done), log_push,
        /*past_hold=*/false);
}

void WorkerClient::RequestPastHold(int server_rank, Message request, Done done) {
  Issue(server_rank, std::move(request), Body{}, std::move(done), false, /*past_hold=*/true);
}

void WorkerClient::Issue(int server_rank, Message request, Body reply_into, Done done,
                         bool log_push, bool past_hold) {
  const uint64_t id = next_id_.fetch_add(1);
  request.header.request_id = id;
  // Shared: requests go out concurrently; Hold and Resume wait for those between check and send.
  std::shared_lock<std::shared_mutex> send_lock(send_mutex_);
  bool held = false;
  bool ask_for_checkpoint = false;
  uint64_t heard_checkpoint = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) {
      auto error = std::make_exception_ptr(PeerError(*failure_));
      done(nullptr, error);
      return;
    }
    Pending p{server_rank, std::move(reply_into), std::move(done), {}, 0};
    if (keep_requests_) {
      p.request = request;  // shares the body
      if (log_push && log_) {
        const PushLog::Recorded r = log_->Record(server_rank, id, request);
        p.round = r.round;
        ask_for_checkpoint = r.ask_for_checkpoint;
        heard_checkpoint = r.heard_checkpoint;
      }
    }
    pending_[id] = std::move(p);
    held = !past_hold && held_.count(server_rank) != 0;
  }
  if (held) return;  // Resume sends it
  Send(server_rank, id, std::move(request));
  send_lock.unlock();
  if (ask_for_checkpoint) AskForCheckpoint(server_rank, heard_checkpoint);
}

void WorkerClient::Send(int server_rank, uint64_t id, Message request) {
  request.header.request_id = id;
  try {
    node_.Send(node_.layout().ServerId(server_rank), std::move(request));
  } catch (const Error&) {
    // A server that can be replaced: the request waits for its replacement (Resume), or for the
    // job's failure if none comes (FailAll).
    if (keep_requests_ && !node_.failure()) return;
    Pending p;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;  // already failed by FailAll
      p = std::move(it->second);
      pending_.erase(it);
    }
    p.done(nullptr, std::current_exception());
  }
}

void WorkerClient::AskForCheckpoint(int server_rank, uint64_t heard) {
  Message msg;
  msg.header.command = Command::kCommand;
  msg.meta = nlohmann::json{{"cmd", "checkpoint_now"}, {"after", heard}}.dump();
  Request(
      server_rank, std::move(msg), Body{},
      LogIfRefused(node_, "asking server " + std::to_string(server_rank) + " for a checkpoint"));
}

void WorkerClient::Hold(int server_rank) {
  std::unique_lock<std::shared_mutex> send_lock(send_mutex_);
  std::lock_guard<std::mutex> lock(mutex_);
  held_.insert(server_rank);
}

void WorkerClient::Resume(int server_rank,
                          const std::map<std::pair<uint64_t, uint32_t>, int64_t>& restored) {
  std::unique_lock<std::shared_mutex> send_lock(send_mutex_);
  std::map<uint64_t, Message> resend;  // by request id: the order they were first sent in
  std::vector<Pending> held_by_checkpoint;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_.erase(server_rank);
    if (failure_) return;
    std::vector<PushLog::Entry> lost;
    try {
      if (log_) lost = log_->Since(server_rank, restored);
    } catch (const PeerError& e) {
      why = e.what();
    }
    if (why.empty()) {
      for (PushLog::Entry& e : lost) resend[e.request_id] = std::move(e.push);
      for (auto it = pending_.begin(); it != pending_.end();) {
        Pending& p = it->second;
        if (p.server != server_rank) {
          ++it;
          continue;
        }
        auto round = restored.find({p.request.header.key, p.request.header.part});
        const int64_t kept = round == restored.end() ? 0 : round->second;
        if (p.round > 0 && p.round <= kept) {
          // Its round is in the checkpoint: a push is done; a pushpull still wants the value.
          resend.erase(it->first);
          if (p.request.header.command == Command::kPush) {
            held_by_checkpoint.push_back(std::move(p));
            it = pending_.erase(it);
            continue;
          }
          Message pull = p.request;
          pull.header.command = Command::kPull;
          pull.body = Body{};
          resend[it->first] = std::move(pull);
        } else {
          resend[it->first] = p.request;
        }
        ++it;
      }
      for (const auto& [id, msg] : resend) {
        if (pending_.count(id) == 0) {
          pending_[id] = Pending{
              server_rank, {}, LogIfRefused(node_, "repeating a push to a restored server"), {}, 0};
        }
      }
    }
  }
  if (!why.empty()) return FailAll(why);
  DTRAIN_LOG(kConnections) << "sending " << resend.size() << " request(s) again to server "
                           << server_rank << "'s replacement";
  for (auto& [id, msg] : resend) Send(server_rank, id, std::move(msg));
  send_lock.unlock();
  for (Pending& p : held_by_checkpoint) p.done(nullptr, nullptr);
}

Body WorkerClient::SinkFor(const transport::Header& header, size_t bytes) {
  if (!header.is_response() || header.is_error()) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(header.request_id);
  if (it == pending_.end() || it->second.reply_into.data == nullptr ||
      it->second.reply_into.size != bytes) {
    return {};
  }
  return it->second.reply_into;
}

void WorkerClient::OnServerNotice(const Message& msg) {
  const transport::Header& h = msg.header;
  if (h.command != Command::kCommand || !node_.layout().IsServer(h.sender)) return;
  const int server = node_.layout().RankOf(h.sender);
  std::string cmd;
  uint64_t checkpoint = 0;
  std::vector<SlotRounds> slots;
  try {
    slots = DecodeSlotRounds(msg.meta, &cmd, &checkpoint);
  } catch (const ProtocolError& e) {
    DTRAIN_LOG(kWarning) << "ignoring a malformed notice from " << node_.NameOf(h.sender) << ": "
                         << e.what();
    return;
  }
  if (cmd != "checkpointed") return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!log_) return;
  for (const SlotRounds& s : slots) log_->Trim(server, {s.key, s.part}, s.rounds);
  log_->CheckpointAnswered(server, checkpoint);
}

void WorkerClient::OnReply(Message&& msg) {
  const auto& h = msg.header;
  if (!h.is_response()) return OnServerNotice(msg);  // workers serve no requests
  Pending p;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pending_.find(h.request_id);
    if (it == pending_.end()) return;  // failed or timed out already
    p = std::move(it->second);
    pending_.erase(it);
  }
  const std::string what = std::string(transport::CommandName(h.command)) + " of key " +
                           std::to_string(h.key) +
                           (h.part ? " part " + std::to_string(h.part) : "");
  if (h.is_error()) {
    p.done(nullptr, std::make_exception_ptr(
                        PeerError(node_.NameOf(h.sender) + " refused " + what + ": " + msg.meta)));
    return;
  }
  if (p.reply_into.data != nullptr && msg.body.data != p.reply_into.data) {
    if (msg.body.size != p.reply_into.size) {
      p.done(nullptr, std::make_exception_ptr(
                          PeerError(node_.NameOf(h.sender) + " answered " + what + " with " +
                                    std::to_string(msg.body.size) + " bytes, expected " +
                                    std::to_string(p.reply_into.size))));
      return;
    }
    std::memcpy(p.reply_into.data, msg.body.data, msg.body.size);
  }
  p.done(&msg, nullptr);
}

void WorkerClient::FailAll(const std::string& why) {
  std::unordered_map<uint64_t, Pending> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_) failure_ = why;
    failed.swap(pending_);
  }
  auto error = std::make_exception_ptr(PeerError(why));
  for (auto& [id, p] : failed) p.done(nullptr, error);
}

}  // namespace dtrain::ps

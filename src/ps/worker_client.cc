#include "ps/worker_client.h"

#include <cstring>

#include "dtrain/common/error.h"

namespace dtrain::ps {

using transport::Body;
using transport::Message;

WorkerClient::WorkerClient(Node& node) : node_(node) {
  node_.SetDataHandler(
      [this](Message&& msg) { OnReply(std::move(msg)); },
      [this](const transport::Header& h, size_t bytes) { return SinkFor(h, bytes); });
  node_.AddFailureListener([this](const std::string& why) { FailAll(why); });
}

void WorkerClient::Request(int server_rank, Message request, Body reply_into, Done done) {
  const uint64_t id = next_id_.fetch_add(1);
  request.header.request_id = id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) {
      auto error = std::make_exception_ptr(PeerError(*failure_));
      done(nullptr, error);
      return;
    }
    pending_[id] = Pending{server_rank, std::move(reply_into), done};
  }
  try {
    node_.Send(node_.layout().ServerId(server_rank), std::move(request));
  } catch (const Error&) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.erase(id) == 0) return;  // already failed by FailAll
    auto error = std::current_exception();
    done(nullptr, error);
  }
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

void WorkerClient::OnReply(Message&& msg) {
  const auto& h = msg.header;
  if (!h.is_response()) return;  // workers serve no requests
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

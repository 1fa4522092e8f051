#include "raw_peer.h"

#include <cstring>

namespace dtrain::testing {

using transport::Body;
using transport::Command;
using transport::Message;

RawPeer::RawPeer(std::shared_ptr<transport::InMemoryNetwork> network, transport::NodeId id)
    : id_(id), transport_(std::make_unique<transport::InMemoryTransport>(std::move(network))) {
  transport_->SetHandlers(
      [this](Message&& msg) {
        std::lock_guard<std::mutex> lock(mutex_);
        inbox_.push_back(std::move(msg));
        changed_.notify_all();
      },
      [this](transport::NodeId peer, const std::string&, const std::string& reason) {
        std::lock_guard<std::mutex> lock(mutex_);
        lost_.push_back(std::to_string(peer) + ": " + reason);
        changed_.notify_all();
      });
}

RawPeer::~RawPeer() { transport_->Shutdown(Deadline(Duration(2000))); }

uint16_t RawPeer::Listen() { return transport_->Listen("", 0); }

void RawPeer::Connect(transport::NodeId peer, uint16_t port, Duration timeout) {
  transport_->Connect(peer, {"inmem", port}, id_, Deadline(timeout));
}

void RawPeer::Send(transport::NodeId to, Message msg, bool keep_sender) {
  if (!keep_sender) msg.header.sender = id_;
  msg.header.recipient = to;
  transport_->Send(to, std::move(msg));
}

std::optional<Message> RawPeer::Take(const std::function<bool(const Message&)>& match,
                                     Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::optional<Message> found;
  changed_.wait_for(lock, timeout, [&] {
    for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
      if (match(*it)) {
        found = std::move(*it);
        inbox_.erase(it);
        return true;
      }
    }
    return false;
  });
  return found;
}

std::optional<Message> RawPeer::TakeCommand(Command command, Duration timeout) {
  return Take([command](const Message& m) { return m.header.command == command; }, timeout);
}

std::optional<Message> RawPeer::TakeReply(uint64_t request_id, Duration timeout) {
  return Take(
      [request_id](const Message& m) {
        return m.header.is_response() && m.header.request_id == request_id;
      },
      timeout);
}

std::vector<std::string> RawPeer::lost() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

Body FloatBody(const std::vector<float>& values) {
  auto owner = std::make_shared<std::vector<float>>(values);
  Body b;
  b.data = reinterpret_cast<char*>(owner->data());
  b.size = owner->size() * sizeof(float);
  b.owner = std::move(owner);
  return b;
}

Body ZeroBody(size_t bytes) {
  auto owner = std::make_shared<std::vector<char>>(bytes, 0);
  Body b;
  b.data = owner->data();
  b.size = bytes;
  b.owner = std::move(owner);
  return b;
}

std::vector<float> Floats(const Body& body) {
  std::vector<float> out(body.size / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), body.data, out.size() * sizeof(float));
  return out;
}

}  // namespace dtrain::testing

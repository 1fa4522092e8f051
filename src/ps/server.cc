#include "ps/server.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <set>

#include "common/buffer_pool.h"
#include "common/elementwise.h"
#include "common/logging.h"
#include "compression/codec.h"
#include "dtrain/common/array.h"
#include "dtrain/common/error.h"
#include "ps/row_sparse_body.h"
#include "ps/server_slot.h"
#include "report/reporter.h"
#include "report/timeline.h"

namespace dtrain::ps {

using transport::Body;
using transport::Command;
using transport::Header;
using transport::Message;

namespace {

// Sums below this many elements stay on the receiving thread; bigger ones are split over the
// MXNET_KVSTORE_REDUCTION_NTHREADS pool.
constexpr int64_t kParallelSumElements = int64_t{1} << 18;

// Bodies received and waiting to be applied, beyond which receiving waits (RequestScheduler):
// a whole step of a big model from a few workers.
constexpr size_t kMaxQueuedBytes = size_t{256} << 20;
// Requests that carry less than this (decoded) run on the transport's thread when their slot is
// idle: applying them costs less than handing them to another thread.
constexpr size_t kRunHereBytes = 64 * 1024;

bool IsDataRequest(const Header& h) {
  return !h.is_response() && transport::IsValueCommand(h.command);
}

// A reply's header: the request's, answering it (its priority too, so the values a worker needs
// first leave first); replies are never compressed.
Header ReplyTo(const Header& request, uint32_t flags) {
  Header h = request;
  h.flags = flags;
  h.compression = Compression::kNone;
  h.threshold = 0;
  h.elements = 0;
  return h;
}

}  // namespace

Body NewBuffer(size_t bytes) {
  auto buffer = BufferPool::Default().Get(bytes);
  Body b;
  b.data = buffer.get();
  b.size = bytes;
  b.owner = std::move(buffer);
  return b;
}

Server::Server(Node& node, const Config& config)
    : node_(node),
      config_(config),
      reduction_pool_(config.reduction_threads),
      scheduler_wait_(std::max(Duration(1000), config.heartbeat_timeout / 3)),
      scheduler_(config.apply_threads, kMaxQueuedBytes, scheduler_wait_,
                 [this](Message&& msg) { RunDataRequest(std::move(msg)); }) {
  report_id_ = report::AddPeriodic([this]() -> nlohmann::json {
    return {{"kind", "traffic"}, {"bytes_in", bytes_in_.load()}, {"bytes_out", bytes_out_.load()}};
  });
}

Server::~Server() {
  StopCheckpoints();
  report::RemovePeriodic(report_id_);
}

void Server::Reply(const Header& request, Body body, std::string meta) {
  bytes_out_.fetch_add(static_cast<int64_t>(body.size), std::memory_order_relaxed);
  Message msg;
  msg.header = ReplyTo(request, transport::kFlagResponse);
  msg.body = std::move(body);
  msg.meta = std::move(meta);
  try {
    node_.Send(request.sender, std::move(msg));
  } catch (const Error& e) {
    DTRAIN_LOG(kWarning) << "cannot answer " << node_.NameOf(request.sender) << ": " << e.what();
  }
}

void Server::ReplyError(const Header& request, const std::string& error) {
  Message msg;
  msg.header = ReplyTo(request, transport::kFlagResponse | transport::kFlagError);
  msg.meta = error;
  DTRAIN_LOG(kConnections) << "refusing " << transport::CommandName(request.command) << " from "
                           << node_.NameOf(request.sender) << ": " << error;
  try {
    node_.Send(request.sender, std::move(msg));
  } catch (const Error&) {
  }
}

void Server::ReplyValue(SlotState& slot, const Header& request) {
  Body body = slot.value;  // shares the buffer; see copy on write in ApplyGradient
  body.size = slot.bytes();
  Reply(request, std::move(body));
}

size_t Server::BodyLimit(const Header& h) {
  if (h.command == Command::kPushRows || h.command == Command::kPullRows) return RowsBodyLimit(h);
  if (h.command == Command::kPull) return 0;
  if (h.command != Command::kPush && h.command != Command::kPushPull) return SIZE_MAX;
  std::shared_lock<std::shared_mutex> lock(slots_mutex_);
  auto it = slots_.find({h.key, h.part});
  if (it == slots_.end()) return 0;
  const SlotState& slot = *it->second;
  if (h.compression != Compression::kNone) return CompressedBytes(h.compression, slot.length);
  return slot.bytes();
}

void Server::Handle(Message&& msg) {
  if (IsDataRequest(msg.header)) {
    const bool cheap = Cheap(msg);
    return scheduler_.Submit(std::move(msg), cheap);
  }
  if (msg.header.is_response()) return;  // servers send no requests
  scheduler_.Fence(scheduler_wait_);
  HandleControl(std::move(msg));
}

bool Server::Cheap(const Message& msg) const {
  const Header& h = msg.header;
  if (h.compression != Compression::kNone) return size_t{h.elements} * 4 < kRunHereBytes;
  if (msg.body.size < kRunHereBytes) return true;
  // One worker and no optimizer: its push becomes the value as it is. Nothing is computed that
  // receiving the next body could overlap, so a hand-off would only add a thread switch.
  return node_.layout().num_workers == 1 && !optimizer_set_.load(std::memory_order_acquire);
}

void Server::RunDataRequest(Message&& msg) {
  const Header h = msg.header;
  try {
    HandleData(std::move(msg));
  } catch (const std::exception& e) {
    ReplyError(h, e.what());  // the requester learns why, the server serves on
  }
}

void Server::HandleControl(Message&& msg) {
  const Header& h = msg.header;
  // (Data requests answer a refused body in HandleData, after checking who sent it and for what.)
  if ((h.flags & transport::kFlagBodyRefused) != 0) {
    return ReplyError(h, std::string(CommandName(h.command)) + " of " + SlotName(h.key, h.part) +
                             " refused: " + msg.meta);
  }
  try {
    switch (h.command) {
      case Command::kInit:
        return HandleInit(std::move(msg));
      case Command::kSetOptimizer:
        return HandleSetOptimizer(msg);
      case Command::kCommand:
        return HandleCommand(msg);
      default:
        return ReplyError(h, "servers do not handle " + std::string(CommandName(h.command)));
    }
  } catch (const std::exception& e) {
    // Never out of the transport's thread: the requester learns why, the server serves on.
    ReplyError(h, e.what());
  }
}

void Server::HandleInit(Message&& msg) {
  const Header h = msg.header;
  auto meta = nlohmann::json::parse(msg.meta, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("length") ||
      !meta["length"].is_number_integer() || !meta.contains("sync") || !meta["sync"].is_boolean()) {
    return ReplyError(h, "malformed init request for " + SlotName(h.key, h.part));
  }
  const int64_t length = meta["length"].get<int64_t>();
  // Compared in elements: length * element size can wrap around to the body's size.
  const size_t elem_size = DTypeSize(h.dtype);
  if (length < 0 || msg.body.size % elem_size != 0 ||
      static_cast<uint64_t>(length) != msg.body.size / elem_size) {
    return ReplyError(h, "init of " + SlotName(h.key, h.part) + " announces " +
                             std::to_string(length) + " elements but carries " +
                             std::to_string(msg.body.size) + " bytes");
  }
  int64_t row_length = 0;
  if (meta.contains("row_length")) {
    if (!meta["row_length"].is_number_unsigned() || meta["row_length"].get<int64_t>() < 1 ||
        length % meta["row_length"].get<int64_t>() != 0) {
      return ReplyError(h, "init of " + SlotName(h.key, h.part) + ": row_length " +
                               meta["row_length"].dump() + " does not divide its " +
                               std::to_string(length) + " elements");
    }
    row_length = meta["row_length"].get<int64_t>();
  }
  auto slot = std::make_unique<SlotState>(h.key, h.part, length, h.dtype, meta["sync"].get<bool>(),
                                          msg.body.owner ? std::move(msg.body) : NewBuffer(0),
                                          node_.layout().num_workers, 0);
  slot->row_length = row_length;
  {
    std::unique_lock<std::shared_mutex> lock(slots_mutex_);
    auto [it, inserted] = slots_.try_emplace({h.key, h.part}, std::move(slot));
    if (!inserted) {
      // A replacement of rank 0 repeats the init its lost process may have sent: the slot, as
      // it is, stays the job's when it has the same size and type.
      const bool again = meta.contains("again") && meta["again"].is_boolean() &&
                         meta["again"].get<bool>() && it->second->length == length &&
                         it->second->dtype == h.dtype;
      if (!again) return ReplyError(h, SlotName(h.key, h.part) + " is already initialised");
    }
  }
  AcknowledgeOnceCheckpointed(h);
}

void Server::HandleSetOptimizer(const Message& msg) {
  InstallOptimizer(msg.meta);
  DTRAIN_LOG(kConnections) << "optimizer set: " << msg.meta;
  AcknowledgeOnceCheckpointed(msg.header);
}

void Server::InstallOptimizer(const std::string& spec_json) {
  OptimizerSpec spec = OptimizerSpec::FromJson(spec_json);
  std::shared_ptr<Optimizer> optimizer = CreateOptimizer(spec);
  // A big slot's update is split over the reduction threads, as its sums are: on one GPU worker
  // with one server, the update of ResNet-18's 11 M weights on one core was most of a step.
  optimizer->SetParallelFor([this](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    ForSlotElements(n, fn);
  });
  std::lock_guard<std::mutex> lock(optimizer_mutex_);
  optimizer_ = std::move(optimizer);
  optimizer_spec_ = spec_json;
  optimizer_set_.store(true, std::memory_order_release);
}

std::shared_ptr<Optimizer> Server::CurrentOptimizer() {
  std::lock_guard<std::mutex> lock(optimizer_mutex_);
  return optimizer_;
}

void Server::HandleCommand(const Message& msg) {
  const Header& h = msg.header;
  auto meta = nlohmann::json::parse(msg.meta, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("cmd") ||
      !meta["cmd"].is_string()) {
    return ReplyError(h, "malformed command");
  }
  std::shared_ptr<Optimizer> optimizer = CurrentOptimizer();
  const std::string cmd = meta["cmd"].get<std::string>();
  if (cmd == "rejoin_state" || cmd == "rejoin") {
    int64_t round = 0;
    if (cmd == "rejoin") {
      if (!meta.contains("round") || !meta["round"].is_number_unsigned()) {
        return ReplyError(h, "rejoin: 'round' missing or not a count");
      }
      round = meta["round"].get<int64_t>();
    }
    return HandleRejoinCommand(msg, cmd, round);
  }
  if (cmd == "restored_rounds" || cmd == "checkpoint_now")
    return HandleCheckpointCommand(h, meta, cmd);
  if (cmd != "get_optimizer_state" && cmd != "set_optimizer_state" && cmd != "set_learning_rate") {
    return ReplyError(h, "unknown command '" + cmd + "'");
  }
  if (!optimizer) return ReplyError(h, "no optimizer is set on this server");
  if (cmd == "set_learning_rate") {
    // {"learning_rate": r, "from_update": t}: rank 0's rate from each slot's update t on
    // (KVStore::SetLearningRate); acknowledged once a checkpoint holds it, as the optimizer's
    // state.
    if (!meta.contains("learning_rate") || !meta["learning_rate"].is_number() ||
        !meta.contains("from_update") || !meta["from_update"].is_number_unsigned()) {
      return ReplyError(h,
                        "set_learning_rate: 'learning_rate' or 'from_update' missing or not a "
                        "number");
    }
    const double rate = meta["learning_rate"].get<double>();
    const uint64_t from = meta["from_update"].get<uint64_t>();
    {
      std::unique_lock<std::shared_mutex> lock(optimizer_state_mutex_);
      optimizer->set_learning_rate_from(from, rate);  // InvalidArgument -> error reply
    }
    DTRAIN_LOG(kConnections) << "learning rate " << rate << " from update " << from;
    return AcknowledgeOnceCheckpointed(h);
  }
  if (cmd == "get_optimizer_state") {
    std::string state;
    {
      std::unique_lock<std::shared_mutex> lock(optimizer_state_mutex_);
      state = optimizer->SaveState();
    }
    // Bodies are whole float32 elements: pad, and say the real length in meta.
    Body body = NewBuffer((state.size() + 3) / 4 * 4);
    std::memset(body.data, 0, body.size);
    std::memcpy(body.data, state.data(), state.size());
    Message reply;
    reply.header = ReplyTo(h, transport::kFlagResponse);
    reply.header.flags = transport::kFlagResponse;
    reply.header.dtype = DType::kFloat32;
    reply.meta = nlohmann::json{{"bytes", state.size()}}.dump();
    reply.body = std::move(body);
    try {
      node_.Send(h.sender, std::move(reply));
    } catch (const Error&) {
    }
    return;
  }
  if (!meta.contains("bytes") || !meta["bytes"].is_number_unsigned() ||
      meta["bytes"].get<uint64_t>() > msg.body.size) {
    return ReplyError(h, "set_optimizer_state: 'bytes' missing or larger than the body");
  }
  const std::string state(msg.body.data, meta["bytes"].get<uint64_t>());
  {
    std::unique_lock<std::shared_mutex> lock(optimizer_state_mutex_);
    optimizer->LoadState(state);  // InvalidArgument -> error reply
  }
  AcknowledgeOnceCheckpointed(h);
}

void Server::HandleData(Message&& msg) {
  const Header& h = msg.header;
  bytes_in_.fetch_add(static_cast<int64_t>(msg.body.size), std::memory_order_relaxed);
  if (!node_.layout().IsWorker(h.sender)) {
    return ReplyError(h, "only workers push and pull; " + node_.NameOf(h.sender) + " is not one");
  }
  SlotState* slot;
  {
    std::shared_lock<std::shared_mutex> lock(slots_mutex_);
    auto it = slots_.find({h.key, h.part});
    if (it == slots_.end()) {
      return ReplyError(h, SlotName(h.key, h.part) +
                               " was never initialised (call init first, "
                               "with the same keys on every worker)");
    }
    slot = it->second.get();
  }
  const bool rows = h.command == Command::kPushRows || h.command == Command::kPullRows;
  if (std::string problem = rows ? RowRequestProblem(*slot, msg) : DenseRequestProblem(*slot, msg);
      !problem.empty()) {
    return ReplyError(h, problem);
  }
  if (IsPushCommand(h.command) && !checkpoint_folder_.empty() &&
      !pushed_since_checkpoint_.load(std::memory_order_relaxed)) {
    pushed_since_checkpoint_.store(true, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(slot->mutex);
  if (slot->sync) {
    SyncMessage(*slot, node_.layout().RankOf(h.sender), std::move(msg));
  } else {
    AsyncMessage(*slot, node_.layout().RankOf(h.sender), std::move(msg));
  }
}

std::string Server::DenseRequestProblem(const SlotState& slot, const Message& msg) {
  const Header& h = msg.header;
  if ((h.flags & transport::kFlagBodyRefused) != 0) {
    return std::string(CommandName(h.command)) + " to " + SlotName(h.key, h.part) +
           " refused: " + msg.meta + " (it holds " + std::to_string(slot.length) + " " +
           std::string(DTypeName(slot.dtype)) + ")";
  }
  if (h.compression != Compression::kNone) {
    // The header fits itself (wire.cc); now it must fit the slot, and the words their format.
    if (slot.dtype != DType::kFloat32 || h.elements != static_cast<uint64_t>(slot.length)) {
      return "compressed " + std::string(CommandName(h.command)) + " to " +
             SlotName(h.key, h.part) + " carries " + std::to_string(h.elements) +
             " float32 values; it holds " + std::to_string(slot.length) + " " +
             std::string(DTypeName(slot.dtype));
    }
    if (!WellFormed(h.compression, msg.body.data, slot.length)) {
      return "compressed push to " + SlotName(h.key, h.part) +
             " holds codes its format does not have";
    }
  } else if (h.command == Command::kPush || h.command == Command::kPushPull) {
    if (h.dtype != slot.dtype || msg.body.size != slot.bytes()) {
      return std::string(CommandName(h.command)) + " to " + SlotName(h.key, h.part) + " carries " +
             std::to_string(msg.body.size / DTypeSize(h.dtype)) + " " +
             std::string(DTypeName(h.dtype)) + " elements; it holds " +
             std::to_string(slot.length) + " " + std::string(DTypeName(slot.dtype));
    }
  }
  return {};
}

std::string Server::FinishedWorkerProblem() {
  if (!any_worker_finished_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> lock(finished_mutex_);
  if (finished_workers_.empty()) return {};
  return "a dist_sync round needs a push from every worker, but worker " +
         std::to_string(finished_workers_.front()) +
         " has finished the job (do all workers run the same number of steps?)";
}

void Server::OnWorkerFinished(int worker_rank) {
  scheduler_.Fence(scheduler_wait_);  // its last requests complete their rounds first
  {
    std::lock_guard<std::mutex> lock(finished_mutex_);
    finished_workers_.push_back(worker_rank);
  }
  any_worker_finished_.store(true, std::memory_order_release);
  const std::string why = FinishedWorkerProblem();
  std::shared_lock<std::shared_mutex> lock(slots_mutex_);
  for (auto& [id, slot] : slots_) {
    std::lock_guard<std::mutex> slot_lock(slot->mutex);
    if (slot->sync && slot->pushed_count > 0) FailRound(*slot, why);
  }
}

void Server::FailRound(SlotState& slot, const std::string& why) {
  for (const Header& h : slot.waiting) ReplyError(h, why);
  for (const auto& [h, rows] : slot.waiting_rows) ReplyError(h, why);
  slot.waiting_rows.clear();
  ClearRowSums(slot);
  for (auto& queue : slot.deferred) {
    for (const Message& m : queue) ReplyError(m.header, why);
    queue.clear();
  }
  slot.waiting.clear();
  slot.merged = Body{};
  std::fill(slot.pushed.begin(), slot.pushed.end(), 0);
  slot.pushed_count = 0;
}

void Server::SyncMessage(SlotState& slot, int worker, Message&& msg) {
  auto& queue = slot.deferred[worker];
  const bool is_push = IsPushCommand(msg.header.command);
  if (is_push) {
    if (std::string problem = FinishedWorkerProblem(); !problem.empty()) {
      return ReplyError(msg.header, problem);
    }
  }
  if (is_push && queue.empty() && slot.absorb[worker] > 0) {
    // A replacement's push of a round its lost process had pushed into: that push counts.
    --slot.absorb[worker];
    ++slot.contributed[worker];
    if (slot.pushed[worker]) {
      slot.waiting.push_back(msg.header);  // answered with the round, when it completes
    } else if (AcknowledgedOnly(msg.header.command)) {
      Reply(msg.header);
    } else {
      ReplyValue(slot, msg.header);
    }
    return;
  }
  if (is_push) {
    DecideLostRounds(slot, worker);
    SkipLostRounds(slot);
  }
  if (!queue.empty() || (is_push && slot.pushed[worker])) {
    queue.push_back(std::move(msg));  // belongs to a later round
  } else {
    Accumulate(slot, worker, std::move(msg));
  }
  while (slot.pushed_count == node_.layout().num_workers) {
    try {
      CompleteRound(slot);
    } catch (const std::exception& e) {
      // Every worker waiting on this round gets the error; the slot is ready for the next round
      // (a wedged slot would hold them until their request timeout).
      return FailRound(
          slot, "applying the round of " + SlotName(slot.key, slot.part) + " failed: " + e.what());
    }
    SkipLostRounds(slot);
    DrainDeferred(slot);
  }
}

void Server::Accumulate(SlotState& slot, int worker, Message&& msg) {
  const Header h = msg.header;
  timeline::Span span(IsPullCommand(h.command) ? "pull" : "merge", "server",
                      timeline::Enabled() ? timeline::Args()
                                                .Int("key", static_cast<int64_t>(h.key))
                                                .Int("part", h.part)
                                                .Int("worker", worker)
                                                .Int("bytes", msg.body.size)
                                          : timeline::Args());
  if (IsPullCommand(h.command)) {
    // A pull waits for the round its worker has pushed into; otherwise the value is current. A
    // replacement whose lost process pushed into this round has not yet: its value is current.
    const bool wait = slot.pushed[worker] && slot.absorb[worker] == 0;
    if (h.command == Command::kPullRows) {
      std::vector<int64_t> rows = DecodeRowRequest(msg.body.data, msg.body.size, slot.rows());
      if (wait) {
        slot.waiting_rows.emplace_back(h, std::move(rows));
      } else {
        ReplyRows(slot, h, rows);
      }
    } else if (wait) {
      slot.waiting.push_back(h);
    } else {
      ReplyValue(slot, h);
    }
    return;
  }
  if (h.command == Command::kPushRows) {
    AccumulateRows(slot, msg);
  } else {
    if (slot.rows_round) DenseRound(slot);  // the rows so far: the dense sum this push adds to
    if (h.compression != Compression::kNone) {
      const bool first = !slot.merged.owner;
      if (first) slot.merged = NewBuffer(slot.bytes());
      Decompress(h, msg.body, slot.merged.data, slot.length, /*accumulate=*/!first);
    } else if (!slot.merged.owner) {
      slot.merged = std::move(msg.body);  // the first push of a round becomes the sum: no copy
    } else {
      Add(slot.merged.data, msg.body.data, slot.length, slot.dtype);
    }
  }
  slot.pushed[worker] = 1;
  ++slot.pushed_count;
  ++slot.contributed[worker];
  slot.waiting.push_back(h);
}

void Server::CompleteRound(SlotState& slot) {
  timeline::Span span("apply", "server",
                      timeline::Enabled() ? timeline::Args()
                                                .Int("key", static_cast<int64_t>(slot.key))
                                                .Int("part", slot.part)
                                                .Int("bytes", slot.bytes())
                                          : timeline::Args());
  if (slot.rows_round) {
    ApplyRowRound(slot);
  } else if (!slot.merged.owner) {
    // Every push of the round was lost (SkipLostRounds): the value stays.
  } else if (std::shared_ptr<Optimizer> optimizer = CurrentOptimizer()) {
    ApplyGradient(slot, slot.merged, optimizer.get());
    slot.merged = Body{};
  } else {
    slot.value = std::move(slot.merged);  // the stored value is the round's sum
    slot.merged = Body{};
    slot.value_holds_rows = false;
  }
  for (const Header& h : slot.waiting) {
    if (AcknowledgedOnly(h.command)) {
      Reply(h);
    } else {
      ReplyValue(slot, h);
    }
  }
  slot.waiting.clear();
  for (const auto& [h, rows] : slot.waiting_rows) ReplyRows(slot, h, rows);
  slot.waiting_rows.clear();
  std::fill(slot.pushed.begin(), slot.pushed.end(), 0);
  slot.pushed_count = 0;
  ++slot.rounds;
}

void Server::DrainDeferred(SlotState& slot) {
  for (size_t w = 0; w < slot.deferred.size(); ++w) {
    auto& queue = slot.deferred[w];
    while (!queue.empty()) {
      const bool is_push = IsPushCommand(queue.front().header.command);
      if (is_push && slot.pushed[w]) break;
      Message msg = std::move(queue.front());
      queue.pop_front();
      Accumulate(slot, static_cast<int>(w), std::move(msg));
    }
  }
}

void Server::AsyncMessage(SlotState& slot, int worker, Message&& msg) {
  const Header h = msg.header;
  const bool is_push = IsPushCommand(h.command);
  if (is_push && slot.absorb[worker] > 0) {
    // A replacement's repeat of a push its lost process had made: that one was applied.
    --slot.absorb[worker];
  } else if (h.command == Command::kPushRows) {
    ApplyPushedRows(slot, msg);
  } else if (h.command == Command::kPullRows) {
    return ReplyRows(slot, h, DecodeRowRequest(msg.body.data, msg.body.size, slot.rows()));
  } else if (h.compression != Compression::kNone) {
    Body grad = NewBuffer(slot.bytes());
    Decompress(h, msg.body, grad.data, slot.length, /*accumulate=*/false);
    ApplyGradient(slot, grad, CurrentOptimizer().get());
  } else if (is_push) {
    ApplyGradient(slot, msg.body, CurrentOptimizer().get());
  }
  if (is_push) ++slot.contributed[worker];
  if (AcknowledgedOnly(h.command)) {
    Reply(h);
  } else {
    ReplyValue(slot, h);
  }
}

void Server::CopyOnWrite(SlotState& slot) {
  // A reply still being sent holds a reference to the value buffer.
  if (slot.value.owner.use_count() > 1) {
    Body fresh = NewBuffer(slot.bytes());
    std::memcpy(fresh.data, slot.value.data, slot.bytes());
    slot.value = std::move(fresh);
  }
}

void Server::ApplyGradient(SlotState& slot, const Body& grad, Optimizer* optimizer) {
  CopyOnWrite(slot);
  if (optimizer) {
    if (slot.dtype != DType::kFloat32) {
      throw InvalidArgument("optimizers support float32 values only, " +
                            SlotName(slot.key, slot.part) + " is " +
                            std::string(DTypeName(slot.dtype)));
    }
    std::shared_lock<std::shared_mutex> state_lock(optimizer_state_mutex_);
    optimizer->Update(
        slot.optimizer_index(),
        {reinterpret_cast<float*>(slot.value.data), static_cast<size_t>(slot.length)},
        {reinterpret_cast<const float*>(grad.data), static_cast<size_t>(slot.length)});
  } else {
    Add(slot.value.data, grad.data, slot.length, slot.dtype);
  }
}

void Server::Decompress(const Header& h, const Body& packed, char* dst, int64_t n,
                        bool accumulate) {
  const CompressionSpec spec{h.compression, h.threshold};
  float* out = reinterpret_cast<float*>(dst);
  if (n < kParallelSumElements || reduction_pool_.size() < 2) {
    return dtrain::Decompress(spec, packed.data, n, out, accumulate);
  }
  // Split at whole words: each thread decodes its own words into its own range.
  const int64_t blocks = (n + kCompressionAlignment - 1) / kCompressionAlignment;
  reduction_pool_.ParallelFor(blocks, [&](int64_t first, int64_t last) {
    const int64_t begin = first * kCompressionAlignment;
    const int64_t end = std::min(n, last * kCompressionAlignment);
    if (end <= begin) return;
    dtrain::Decompress(spec, packed.data + CompressedBytes(spec.type, begin), end - begin,
                       out + begin, accumulate);
  });
}

void Server::Add(char* dst, const char* src, int64_t n, DType dtype) {
  const size_t elem = DTypeSize(dtype);
  ForSlotElements(n, [&](int64_t begin, int64_t end) {
    AddInto(dst + begin * elem, src + begin * elem, end - begin, dtype);
  });
}

void Server::ForSlotElements(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n < kParallelSumElements || reduction_pool_.size() < 2) return fn(0, n);
  reduction_pool_.ParallelFor(n, fn);
}

}  // namespace dtrain::ps

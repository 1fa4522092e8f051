#include "kvstore/dist_kvstore.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "common/buffer_pool.h"
#include "common/elementwise.h"
#include "common/logging.h"
#include "common/usable_cores.h"
#include "dtrain/common/error.h"
#include "kvstore/array_checks.h"
#include "kvstore/key_names.h"
#include "kvstore/operation_state.h"
#include "optim/optimizer.h"
#include "report/reporter.h"
#include "report/timeline.h"

namespace dtrain {

using transport::Body;
using transport::Command;
using transport::Message;

namespace {

std::string Describe(const Array& a) {
  return ShapeToString(a.shape()) + " " + std::string(DTypeName(a.dtype()));
}

// A body covering elements [offset, offset + length) of `source`.
Body Slice(const Body& source, int64_t offset, int64_t length, DType dtype) {
  const size_t elem = DTypeSize(dtype);
  Body b;
  b.owner = source.owner;
  b.data = source.data + offset * elem;
  b.size = static_cast<size_t>(length) * elem;
  return b;
}

// One arena per server for the push log's copies, each keeping spare slabs up to the log's bound.
std::vector<std::shared_ptr<SlabArena>> PushLogArenas(const Config& config) {
  const size_t bound =
      config.replay_log_bytes > 0 ? config.replay_log_bytes : ps::PushLog::kAutoMaxBytes;
  std::vector<std::shared_ptr<SlabArena>> arenas;
  for (int s = 0; s < config.num_servers; ++s) arenas.push_back(SlabArena::Create(bound));
  return arenas;
}

// What one server's arena is filled with before a worker first asks that server for a checkpoint
// (ps/push_log.h: at half of the server's share of the bound, the default bound at least
// kAutoMinBytes), and one slab more for the pushes until the checkpoint's answer comes.
size_t FirstFillBytes(const Config& config) {
  const size_t bound =
      config.replay_log_bytes > 0 ? config.replay_log_bytes : ps::PushLog::kAutoMinBytes;
  const size_t share = bound / (2 * static_cast<size_t>(std::max(config.num_servers, 1)));
  return share + SlabArena::kSlabBytes;  // Reserve rounds up to whole slabs
}

// How long this worker's waits poll before they sleep (OperationState's `spin`): where the
// host has a core for each of its workers. Servers on the host are not counted: a poller yields
// its core to them, and polling shortened the Trainer's LeNet steps by 9% with 2 workers and 2
// servers on 2 cores (docs/performance.md, "Waiting callers poll before they sleep").
std::chrono::microseconds WorkerWaitSpin(const Config& config) {
  if (config.local_workers > UsableCores()) return std::chrono::microseconds(0);
  return config.allreduce.tuning.spin_wait;
}

Body WholeArray(const Array& a) {
  Body b;
  b.owner = a.owner();
  b.data = a.bytes();
  b.size = a.nbytes();
  return b;
}

}  // namespace

DistKVStore::DistKVStore(std::string type, const Config& config,
                         std::unique_ptr<transport::Transport> transport, bool exit_on_failure)
    : type_(std::move(type)),
      sync_(type_.find("async") == std::string::npos),
      log_pushes_(config.ServersReplaceable()),
      log_buffers_(log_pushes_ ? PushLogArenas(config) : std::vector<std::shared_ptr<SlabArena>>{}),
      config_(config),
      wait_spin_(WorkerWaitSpin(config)),
      node_(config, Role::kWorker, std::move(transport), ps::Node::Options{exit_on_failure}),
      client_(node_),
      partition_(config.num_servers, config.bigarray_bound, config.chunk_bytes,
                 config.partition_bytes) {
  if (config.ServersReplaceable()) {
    client_.EnableReplay(config.replay_log_bytes, log_pushes_);
    node_.SetServerReplacedHandlers([this](int server) { client_.Hold(server); },
                                    [this](int server) { OnServerRestarted(server); });
  }
  // The push log's first fill is faulted in while this worker waits for the job to form, not in
  // its first training steps. Its figures are taken once this worker has joined; if joining
  // throws, the future's destructor waits for it.
  std::future<std::pair<size_t, double>> reserving;
  if (log_pushes_) {
    reserving =
        std::async(std::launch::async, [arenas = log_buffers_, bytes = FirstFillBytes(config)] {
          const auto begin = std::chrono::steady_clock::now();
          size_t reserved = 0;
          for (const auto& arena : arenas) reserved += arena->Reserve(bytes);
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin)
                  .count();
          DTRAIN_LOG(kConnections) << "push log: " << (reserved >> 20)
                                   << " MB faulted in while joining, in " << ms << " ms";
          return std::make_pair(reserved, ms);
        });
  }
  try {
    node_.Start();
    if (reserving.valid()) std::tie(log_reserved_bytes_, log_reserve_ms_) = reserving.get();
    if (node_.rejoined()) Rejoin();
  } catch (...) {
    // The transport's thread may be inside client_ (a failure listener): stop it before the
    // members are destroyed, client_ first.
    node_.Shutdown();
    throw;
  }
}

DistKVStore::~DistKVStore() {
  if (log_pushes_) {
    const double copy_ms = static_cast<double>(log_copy_ns_.load()) / 1e6;
    DTRAIN_LOG(kConnections) << "push log: " << log_copied_bytes_.load() << " bytes copied in "
                             << copy_ms << " ms";
    report::Send({{"kind", "push_log"},
                  {"bytes", log_copied_bytes_.load()},
                  {"copy_ms", copy_ms},
                  {"reserved_bytes", log_reserved_bytes_},
                  {"reserve_ms", log_reserve_ms_}});
  }
  try {
    if (!node_.failure()) {  // after a failure there is nothing to wait for; it was logged
      try {
        WaitAll();
      } catch (const Error& e) {
        // An operation failed (its caller was told): this worker must still leave in order, or
        // the scheduler waits for it until PS_HEARTBEAT_TIMEOUT and then fails the whole job.
        DTRAIN_LOG(kWarning) << "leaving the job with an operation that failed: " << e.what();
      }
      node_.Finish();
    }
  } catch (const std::exception& e) {
    if (!node_.failure()) DTRAIN_LOG(kError) << "while leaving the job: " << e.what();
  }
  node_.Shutdown();
}

int DistKVStore::rank() const { return node_.self().rank; }

int DistKVStore::num_workers() const { return node_.layout().num_workers; }

const DistKVStore::KeyInfo& DistKVStore::Lookup(Key key, const char* op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    throw InvalidArgument(std::string(op) + " of key " + KeyLabel(key) +
                          ": the key was never initialised (call Init first)");
  }
  return it->second;  // entries are never erased, so the reference stays valid
}

void DistKVStore::Check(Key key, const KeyInfo& info, const std::vector<Array>& arrays,
                        const char* op, const char* what) const {
  if (arrays.empty()) {
    throw InvalidArgument(std::string(op) + " of key " + KeyLabel(key) + " was given no " + what);
  }
  const int64_t size = NumElements(info.shape);
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Array& a = arrays[i];
    if (!a.defined() || a.size() != size || a.dtype() != info.dtype) {
      throw InvalidArgument(
          std::string(op) + " of key " + KeyLabel(key) + ": " + what + " " + std::to_string(i) +
          " is " + (a.defined() ? Describe(a) : std::string("undefined")) + ", the key holds " +
          ShapeToString(info.shape) + " " + std::string(DTypeName(info.dtype)));
    }
  }
}

void DistKVStore::Init(Key key, const Array& value) {
  Init(std::span<const Key>(&key, 1), std::span<const Array>(&value, 1));
}

void DistKVStore::Init(std::span<const Key> keys, std::span<const Array> values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument("init: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  }
  node_.ThrowIfFailed();
  std::vector<std::pair<int, Message>> requests;
  bool setup_done = false;  // by the job, before this replacement came: only record the keys
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) {
      CheckKey(keys[i]);
      CheckInitValue("Init", keys[i], values[i]);
      if (keys_.count(keys[i]) != 0) {
        throw InvalidArgument("init of key " + KeyLabel(keys[i]) +
                              ": the key is already initialised");
      }
      for (size_t j = 0; j < i; ++j) {
        if (keys[j] == keys[i])
          throw InvalidArgument("init lists key " + KeyLabel(keys[i]) + " twice");
      }
    }
    setup_done = TakeSetupDoneByTheJob();
    for (size_t i = 0; i < keys.size(); ++i) {
      const Array& v = values[i];
      // A matrix's slots hold whole rows (row-sparse pushes and pulls).
      const int64_t row_elements =
          v.shape().size() >= 2 ? NumElements(Shape(v.shape().begin() + 1, v.shape().end())) : 0;
      const auto& slots = partition_.Add(static_cast<uint64_t>(keys[i]), v.size(), v.dtype(),
                                         std::max<int64_t>(row_elements, 1));
      keys_[keys[i]] = KeyInfo{v.shape(),        v.dtype(),    slots,
                               ServersOf(slots), row_elements, std::make_shared<Residual>()};
      // Rank 0's values are the ones kept, as in MXNet; a replacement finds them there.
      if (rank() != 0 || setup_done) continue;
      const Body whole = WholeArray(v);
      for (const auto& slot : slots) {
        Message msg;
        msg.header.command = Command::kInit;
        msg.header.key = static_cast<uint64_t>(keys[i]);
        msg.header.part = slot.part;
        msg.header.dtype = v.dtype();
        // "again": a replacement of rank 0 that the lost process may have beaten to it.
        nlohmann::json meta{{"length", slot.length}, {"sync", sync_}, {"again", node_.rejoined()}};
        if (row_elements > 0) meta["row_length"] = row_elements;
        msg.meta = meta.dump();
        msg.body = Slice(whole, slot.offset, slot.length, v.dtype());
        requests.emplace_back(slot.server, std::move(msg));
      }
    }
  }
  RequestAndWait("init", std::move(requests));
  if (!setup_done) node_.Barrier(ps::Group::kWorkers, /*setup=*/true);
}

std::string DistKVStore::ServersOf(const std::vector<ps::Slot>& slots) const {
  std::vector<int> servers;
  for (const auto& slot : slots) {
    if (std::find(servers.begin(), servers.end(), slot.server) == servers.end()) {
      servers.push_back(slot.server);
    }
  }
  std::string out = " on ";
  for (size_t i = 0; i < servers.size(); ++i) {
    out += (i ? ", " : "") + node_.NameOf(node_.layout().ServerId(servers[i]));
  }
  return out;
}

void DistKVStore::AskEveryServer(const std::string& what, const nlohmann::json& command,
                                 std::function<void(int, const Message&)> read) {
  const int servers = node_.layout().num_servers;
  auto state = std::make_shared<OperationState>(what, servers, config_.request_timeout, wait_spin_);
  for (int s = 0; s < servers; ++s) {
    Message msg;
    msg.header.command = Command::kCommand;
    msg.meta = command.dump();
    client_.Request(s, std::move(msg), Body{},
                    [state, read, s](const Message* reply, std::exception_ptr error) {
                      if (reply) {
                        try {
                          read(s, *reply);
                        } catch (const PeerError&) {
                          error = std::current_exception();
                        }
                      }
                      state->PartDone(error);
                    });
  }
  state->Wait();
}

void DistKVStore::RequestAndWait(const std::string& what,
                                 std::vector<std::pair<int, Message>> requests) {
  if (requests.empty()) return;
  auto state = std::make_shared<OperationState>(what, static_cast<int>(requests.size()),
                                                config_.request_timeout, wait_spin_);
  for (auto& [server, msg] : requests) {
    client_.Request(server, std::move(msg), Body{},
                    [state](const Message*, std::exception_ptr error) { state->PartDone(error); });
  }
  state->Wait();
}

void DistKVStore::SetOptimizer(const OptimizerSpec& spec) {
  CreateOptimizer(spec);  // validates here, where the error is the caller's
  {
    std::lock_guard<std::mutex> lock(mutex_);
    optimizer_spec_ = spec;
  }
  if (TakeSetupDoneByTheJob()) return;  // the servers' optimizer, and its state, are the job's
  if (rank() == 0) {
    std::vector<std::pair<int, Message>> requests;
    for (int s = 0; s < node_.layout().num_servers; ++s) {
      Message msg;
      msg.header.command = Command::kSetOptimizer;
      msg.meta = spec.ToJson();
      requests.emplace_back(s, std::move(msg));
    }
    RequestAndWait("set optimizer", std::move(requests));
  }
  node_.Barrier(ps::Group::kWorkers, /*setup=*/true);
}

// The servers' states side by side: "DTKV", u32 count, then per server u64 length and bytes.
std::string DistKVStore::SaveOptimizerState() {
  node_.ThrowIfFailed();
  const int servers = node_.layout().num_servers;
  auto parts = std::make_shared<std::vector<std::string>>(servers);
  AskEveryServer("fetching the optimizer state", {{"cmd", "get_optimizer_state"}},
                 [parts](int s, const Message& reply) {
                   auto meta = nlohmann::json::parse(reply.meta, nullptr, false);
                   if (!meta.is_object() || !meta.contains("bytes") ||
                       !meta["bytes"].is_number_unsigned() ||
                       meta["bytes"].get<uint64_t>() > reply.body.size) {
                     throw PeerError("malformed optimizer state from server " + std::to_string(s));
                   }
                   (*parts)[s].assign(reply.body.data, meta["bytes"].get<uint64_t>());
                 });
  std::string out = "DTKV";
  auto put = [&out](uint64_t v, size_t n) { out.append(reinterpret_cast<const char*>(&v), n); };
  put(static_cast<uint64_t>(servers), 4);
  for (const auto& p : *parts) {
    put(p.size(), 8);
    out += p;
  }
  return out;
}

void DistKVStore::LoadOptimizerState(const std::string& blob) {
  const int servers = node_.layout().num_servers;
  size_t at = 0;
  auto take = [&](size_t n) {
    if (blob.size() - at < n) throw InvalidArgument("optimizer state truncated");
    uint64_t v = 0;
    std::memcpy(&v, blob.data() + at, n);
    at += n;
    return v;
  };
  if (blob.size() < 4 || blob.compare(0, 4, "DTKV") != 0) {
    throw InvalidArgument("not a dist kvstore optimizer state");
  }
  at = 4;
  if (take(4) != static_cast<uint64_t>(servers)) {
    throw InvalidArgument(
        "the optimizer state was saved by a job with a different number of "
        "servers (DMLC_NUM_SERVER must be the same to resume)");
  }
  std::vector<std::pair<int, Message>> requests;
  for (int s = 0; s < servers; ++s) {
    const uint64_t n = take(8);
    if (blob.size() - at < n) throw InvalidArgument("optimizer state truncated");
    auto buffer = BufferPool::Default().Get((n + 3) / 4 * 4);
    std::memset(buffer.get(), 0, (n + 3) / 4 * 4);
    std::memcpy(buffer.get(), blob.data() + at, n);
    at += n;
    Message msg;
    msg.header.command = Command::kCommand;
    msg.meta = nlohmann::json{{"cmd", "set_optimizer_state"}, {"bytes", n}}.dump();
    msg.body.data = buffer.get();
    msg.body.size = (n + 3) / 4 * 4;
    msg.body.owner = std::move(buffer);
    requests.emplace_back(s, std::move(msg));
  }
  if (at != blob.size()) throw InvalidArgument("trailing bytes after the optimizer state");
  RequestAndWait("restoring the optimizer state", std::move(requests));
}

void DistKVStore::SetLearningRate(double learning_rate, uint64_t from_update) {
  std::optional<OptimizerSpec> spec;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    spec = optimizer_spec_;
  }
  if (!spec) throw InvalidArgument("this kvstore has no optimizer whose rate to set");
  // The servers' optimizer's own checks, run here, so that no server takes a change another
  // refuses.
  CreateOptimizer(*spec)->set_learning_rate_from(from_update, learning_rate);
  node_.ThrowIfFailed();
  if (rank() != 0) return;  // the servers take rank 0's (kvstore.h)
  AskEveryServer("setting the learning rate",
                 {{"cmd", "set_learning_rate"},
                  {"learning_rate", learning_rate},
                  {"from_update", from_update}},
                 [](int, const Message&) {});
  DTRAIN_LOG(kConnections) << "learning rate " << learning_rate << " from update " << from_update;
}

Body DistKVStore::NewPushBody(const KeyInfo& info, size_t bytes) const {
  Body out;
  const size_t server = info.slots.empty() ? 0 : static_cast<size_t>(info.slots.front().server);
  auto buffer = server < log_buffers_.size()
                    ? log_buffers_[server]->Get(std::max<size_t>(bytes, 1))
                    : BufferPool::Default().Get(std::max<size_t>(bytes, 1));
  out.data = buffer.get();
  out.size = bytes;
  out.owner = std::move(buffer);
  return out;
}

Body DistKVStore::OwnCopy(const KeyInfo& info, const Body& b) const {
  Body out = NewPushBody(info, b.size);
  std::memcpy(out.data, b.data, b.size);
  return out;
}

Body DistKVStore::LogCopy(const KeyInfo& info, const Body& b) {
  Body out = NewPushBody(info, b.size);
  const auto begin = std::chrono::steady_clock::now();
  CopyBypassingCaches(out.data, b.data, b.size);
  log_copy_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - begin)
          .count());
  log_copied_bytes_ += b.size;
  return out;
}

Body DistKVStore::Summed(const KeyInfo& info, const std::vector<Array>& values) const {
  if (values.size() == 1) return WholeArray(values[0]);
  Body sum = OwnCopy(info, WholeArray(values[0]));
  for (size_t i = 1; i < values.size(); ++i) {
    AddInto(sum.data, values[i].data(), values[i].size(), info.dtype);
  }
  return sum;
}

Body DistKVStore::Compressed(const KeyInfo& info, const Body& source,
                             const CompressionSpec& spec) const {
  const int64_t n = NumElements(info.shape);
  Body out = NewPushBody(info, CompressedBytes(spec.type, n));
  Residual& residual = *info.residual;
  std::lock_guard<std::mutex> lock(residual.mutex);
  if (residual.values.empty()) residual.values.assign(static_cast<size_t>(n), 0.0f);
  Compress(spec, reinterpret_cast<const float*>(source.data), residual.values.data(), n, out.data);
  return out;
}

CompressionSpec DistKVStore::PushCompression(Key key, const KeyInfo& info, const char* op) {
  pushed_ = true;
  if (!compression_.AppliesTo(NumElements(info.shape))) return CompressionSpec{};
  if (compression_.enabled() && info.dtype != DType::kFloat32) {
    throw InvalidArgument(std::string(op) + " of key " + KeyLabel(key) +
                          ": gradient compression works on float32 values, the key holds " +
                          std::string(DTypeName(info.dtype)));
  }
  return compression_;
}

void DistKVStore::SetGradientCompression(const std::map<std::string, std::string>& params) {
  const CompressionSpec spec = CompressionSpec::FromParams(params);
  std::lock_guard<std::mutex> lock(mutex_);
  if (pushed_) {
    throw InvalidArgument("set_gradient_compression after a push: set it before the first push");
  }
  compression_ = spec;
}

CompressionSpec DistKVStore::gradient_compression() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return compression_;
}

std::shared_ptr<OperationState> DistKVStore::Track(std::string what, int parts) {
  auto state =
      std::make_shared<OperationState>(std::move(what), parts, config_.request_timeout, wait_spin_);
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(outstanding_, [](const auto& s) { return s->done(); });
  outstanding_.push_back(state);
  return state;
}

Operation DistKVStore::Issue(Command command, const StagedCall& call) {
  const char* op = command == Command::kPush   ? "push"
                   : command == Command::kPull ? "pull"
                                               : "pushpull";
  const Key key = call.key;
  const std::vector<Array>& values = call.values;
  const std::vector<Array>& outs = call.outs;
  const KeyInfo& info = Lookup(key, op);
  const bool packed = call.packed.has_value();
  if (packed && values.size() != 1) {
    throw InvalidArgument(std::string(op) + " of key " + KeyLabel(key) + ": a packed value is " +
                          "one array, " + std::to_string(values.size()) + " were given");
  }
  if (command != Command::kPull && !packed) Check(key, info, values, op, "value");
  if (command != Command::kPush) Check(key, info, outs, op, "output");
  node_.ThrowIfFailed();

  CompressionSpec compression;
  if (command != Command::kPull) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (packed) {
      CheckPackedValue(op, key, Array::Wrap(nullptr, info.shape, info.dtype, nullptr), *call.packed,
                       compression_, values[0]);
    }
    compression = PushCompression(key, info, op);
  }
  // The pushed value's first `bytes` bytes are on the host once this returns (staged_calls.h).
  bool value_on_host = !call.await_value || command == Command::kPull;
  if (!value_on_host && (log_pushes_ || values.size() > 1 || (compression.enabled() && !packed))) {
    // Copying into the push log, summing several values and compressing read the value whole.
    call.await_value(values[0].nbytes());
    value_on_host = true;
  }
  Body source;
  if (packed) {
    source = WholeArray(values[0]);
    // The caller's (often a pinned staging buffer, soon reused): the push log keeps its own copy.
    if (log_pushes_) source = LogCopy(info, source);
  } else if (command != Command::kPull) {
    source = Summed(info, values);
    if (compression.enabled()) {
      source = Compressed(info, source, compression);
    } else if (log_pushes_ && values.size() == 1) {
      source = LogCopy(info, source);  // kept in the push log after the caller's array changes
    }
  }
  const Body destination = command == Command::kPush ? Body{} : WholeArray(outs[0]);
  auto state = Track(std::string(op) + " of key " + KeyLabel(key) + info.servers,
                     static_cast<int>(info.slots.size()));
  if (timeline::Enabled()) {
    const size_t bytes = command == Command::kPull ? 0 : source.size;
    state->WhenDone([op, key, bytes, begin = timeline::Now()] {
      timeline::Complete(op, "kvstore", begin, timeline::Now(),
                         timeline::Args().Str("key", KeyLabel(key)).Int("bytes", bytes));
    });
  }
  const size_t elem = DTypeSize(info.dtype);
  for (size_t i = 0; i < info.slots.size(); ++i) {
    const ps::Slot& slot = info.slots[i];
    Message msg;
    msg.header.priority = static_cast<int16_t>(std::clamp(call.priority, -32768, 32767));
    msg.header.command = command;
    msg.header.key = static_cast<uint64_t>(key);
    msg.header.part = slot.part;
    msg.header.dtype = info.dtype;
    if (compression.enabled()) {
      // Slots start at whole words (key_partition.h): the key's words, sliced.
      msg.header.compression = compression.type;
      msg.header.threshold = compression.threshold;
      msg.header.elements = static_cast<uint32_t>(slot.length);
      msg.body = source;
      msg.body.data += CompressedBytes(compression.type, slot.offset);
      msg.body.size = CompressedBytes(compression.type, slot.length);
    } else if (command != Command::kPull) {
      msg.body = Slice(source, slot.offset, slot.length, info.dtype);
    }
    if (!value_on_host) {
      try {  // the slot's bytes of values[0], which is `source` here
        call.await_value(static_cast<size_t>(msg.body.data - source.data) + msg.body.size);
      } catch (...) {
        // Its slots from this one on are never sent: the operation fails with the reason.
        for (size_t j = i; j < info.slots.size(); ++j) state->PartDone(std::current_exception());
        break;
      }
    }
    Body reply_into;
    if (command != Command::kPush)
      reply_into = Slice(destination, slot.offset, slot.length, info.dtype);
    // Further local devices get a copy of each slice as it arrives; then the caller is told.
    auto done = [state, outs, slot, elem, ready = call.output_ready](const Message*,
                                                                     std::exception_ptr error) {
      const size_t begin = slot.offset * elem, length = slot.length * elem;
      if (!error && outs.size() > 1) {
        for (size_t i = 1; i < outs.size(); ++i) {
          std::memcpy(outs[i].bytes() + begin, outs[0].bytes() + begin, length);
        }
      }
      if (!error && ready) {
        // It must not throw (staged_calls.h); if it does, the operation fails, not this thread.
        try {
          ready(begin, begin + length);
        } catch (...) {
          error = std::current_exception();
        }
      }
      state->PartDone(error);
    };
    client_.Request(slot.server, std::move(msg), std::move(reply_into), std::move(done),
                    /*log_push=*/log_pushes_ && command != Command::kPull);
  }
  return Operation(state);
}

Operation DistKVStore::IssueStaged(StagedCall call) {
  const Command command = call.values.empty() ? Command::kPull
                          : call.outs.empty() ? Command::kPush
                                              : Command::kPushPull;
  return Issue(command, call);
}

Operation DistKVStore::Push(Key key, std::vector<Array> values, int priority) {
  return Issue(Command::kPush, StagedCall::Of(key, std::move(values), {}, priority));
}

Operation DistKVStore::Pull(Key key, std::vector<Array> outs, int priority) {
  return Issue(Command::kPull, StagedCall::Of(key, {}, std::move(outs), priority));
}

Operation DistKVStore::PushPull(Key key, std::vector<Array> values, std::vector<Array> outs,
                                int priority) {
  return Issue(Command::kPushPull,
               StagedCall::Of(key, std::move(values), std::move(outs), priority));
}

void DistKVStore::WaitAll() {
  std::vector<std::shared_ptr<OperationState>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(outstanding_);
  }
  for (auto& s : pending) s->Wait();
}

void DistKVStore::Barrier() { node_.Barrier(ps::Group::kWorkers); }

}  // namespace dtrain

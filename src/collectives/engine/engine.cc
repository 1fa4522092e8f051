#include "collectives/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

#include "collectives/adasum.h"
#include "collectives/engine/engine_impl.h"
#include "collectives/error_text.h"
#include "common/logging.h"
#include "common/usable_cores.h"
#include "cuda/cuda.h"
#include "dtrain/common/error.h"
#include "report/timeline.h"

namespace dtrain::collectives {
namespace {

// Each rank's message gets this much room in the round's fixed-size allgather; a longer one (a
// first step that names hundreds of tensors) goes in a second allgatherv. Numbered announcements
// are 4 bytes, so a steady-state step of ~250 tensors fits in one round trip.
constexpr size_t kSlotBytes = 1024;
constexpr size_t kSlotPayload = kSlotBytes - 4;
constexpr size_t kMaxRoundBytes = size_t{64} << 20;
// How long Shutdown waits for a failed engine's thread to come back from the backend.
constexpr Duration kFailedShutdownGrace(3000);

}  // namespace

// ---------------------------------------------------------------------------------------------

namespace {

// A refusal of `name` (OpKind::kRefused) for the other ranks; nobody waits for its handle.
Request Refusal(const std::string& name, const std::string& what, Duration timeout) {
  Request refusal;
  refusal.name = name;
  refusal.desc.kind = OpKind::kRefused;
  refusal.state = std::make_shared<Handle::State>(what, timeout);
  return refusal;
}

}  // namespace

// A caller waiting for a collective polls its handle, yielding the core, for up to
// DTRAIN_SPIN_WAIT_US before it sleeps (common/poll_yielding.h). A sleeping caller's core goes
// idle, and the chain of wake-ups that ends a collective (this rank's engine, the other ranks'
// engines, the caller) then pays for idle cores to wake: on 2 cores a 4-byte allreduce a step
// cost 0.2-0.6 ms a training step, where a polled barrier cost 0-3% of one, and polling waits
// made the Horovod API's steps 0-16% shorter (docs/performance.md, "Waiting callers poll before
// they sleep"). Only where the host has a core for each of its ranks: with more ranks than cores a
// poller would take the core of a rank with work to do.
std::chrono::microseconds SpinWaitFor(const CollectivesConfig& config,
                                      const Communicator& backend) {
  const int cores = UsableCores();
  if (config.spin_wait.count() > 0 && backend.local_size() > cores) {
    DTRAIN_LOG(kConnections) << "collectives: waits sleep at once (" << backend.local_size()
                             << " ranks share this host's " << cores << " usable cores)";
    return std::chrono::microseconds(0);
  }
  return config.spin_wait;
}

Handle Engine::Impl::Submit(Request request) {
  auto state = request.state;
  state->waiters = waiters;
  state->spin = spin_wait;
  if (spin_wait.count() > 0) {
    state->help_round = [engine = weak_from_this()] {
      const auto impl = engine.lock();
      return impl && impl->HelpWithRound();
    };
  }
  std::unique_lock<std::mutex> lock(mutex);
  if (failure || shutdown_requested) {
    const Failure f =
        failure ? *failure : Failure{ErrorKind::kOther, "the collectives engine was shut down"};
    lock.unlock();
    collectives.fetch_add(1, std::memory_order_relaxed);
    state->Complete(f.For(state->what));
    return Handle(state);
  }
  if (request.desc.on_device) {
    if (!config.nccl) {
      throw InvalidArgument(state->what +
                            ": its tensor is in GPU memory, and this job reduces CUDA tensors "
                            "through host memory (HOROVOD_GPU_OPERATIONS is not NCCL, or NCCL was "
                            "not built): copy it to the host first");
    }
    const int device = request.in.device();
    if (nccl_device < 0) nccl_device = device;
    if (device != nccl_device) {
      throw InvalidArgument(state->what + ": its tensor is on GPU " + std::to_string(device) +
                            ", but this rank's collectives use GPU " + std::to_string(nccl_device) +
                            " (NCCL: one GPU per rank; torch.cuda.set_device(local_rank))");
    }
  }
  if (in_flight.count(request.name)) {
    // Another rank may have seen its first collective of this name finish before it submitted
    // the second, and accepted it: the refusal follows the first collective to the other ranks
    // (announced once the first is done, where the other ranks' second one is), so that every
    // rank's fails. Nobody waits for the refusal's own handle.
    refused[request.name].push_back(Refusal(request.name, state->what, state->timeout));
    throw InvalidArgument(state->what +
                          ": a collective of this name is already in flight (names must be unique "
                          "among the collectives in flight; wait for the first one)");
  }
  in_flight.emplace(request.name, state);
  if (request.desc.on_device) device_seen.store(true);  // before it can be in a round
  if (holds > 0) {  // SubmittedTogether: announced together once the last hold ends
    held.push_back(std::move(request));
    return Handle(state);
  }
  const bool was_empty = queue.empty();
  queue.push_back(std::move(request));
  lock.unlock();
  // An idle engine starts a round at once: the peers that submitted the same name are already
  // waiting in theirs. Later submissions of the burst join the next round.
  if (was_empty) wake.notify_one();
  return Handle(state);
}

std::vector<RoundMessage> Engine::Impl::Exchange(const RoundMessage& mine) {
  const std::vector<char> bytes = EncodeRound(mine);
  if (bytes.size() > kMaxRoundBytes) {
    throw InvalidArgument("too many collectives submitted in one cycle (" +
                          std::to_string(bytes.size()) + " bytes of names)");
  }
  const uint32_t length = static_cast<uint32_t>(bytes.size());
  send_slot.assign(kSlotBytes, 0);
  std::memcpy(send_slot.data(), &length, 4);
  std::memcpy(send_slot.data() + 4, bytes.data(), std::min(bytes.size(), kSlotPayload));
  recv_slots.resize(kSlotBytes * size);
  backend->Allgatherv(send_slot.data(), recv_slots.data(), std::vector<size_t>(size, kSlotBytes));

  std::vector<size_t> lengths(size);
  std::vector<size_t> extra(size);
  size_t extra_total = 0;
  for (int r = 0; r < size; ++r) {
    uint32_t n = 0;
    std::memcpy(&n, recv_slots.data() + r * kSlotBytes, 4);
    if (n > kMaxRoundBytes) {
      throw ProtocolError("rank " + std::to_string(r) + " sent a negotiation message of " +
                          std::to_string(n) + " bytes, more than the " +
                          std::to_string(kMaxRoundBytes) + " allowed");
    }
    lengths[r] = n;
    extra[r] = n > kSlotPayload ? n - kSlotPayload : 0;
    extra_total += extra[r];
  }
  if (extra_total > 0) {
    // Every rank saw the same lengths, so every rank makes this second call.
    overflow.resize(extra_total);
    backend->Allgatherv(bytes.data() + std::min(bytes.size(), kSlotPayload), overflow.data(),
                        extra);
  }
  std::vector<RoundMessage> round(size);
  size_t overflow_offset = 0;
  std::vector<char> message;
  for (int r = 0; r < size; ++r) {
    const char* slot = recv_slots.data() + r * kSlotBytes + 4;
    message.assign(slot, slot + std::min(lengths[r], kSlotPayload));
    message.insert(message.end(), overflow.data() + overflow_offset,
                   overflow.data() + overflow_offset + extra[r]);
    overflow_offset += extra[r];
    round[r] = DecodeRound(message, r);
  }
  return round;
}

void Engine::Impl::Execute(std::vector<ReadyCollective>& ready) {
  // Every rank has the same `ready` list, so every rank makes the same decisions below and the
  // same backend calls in the same order.
  std::vector<std::pair<Request*, const ReadyCollective*>> singles;
  for (auto& c : ready) {
    if (!c.joined.empty() && c.joined[rank]) {
      // An allreduce this rank joins with zeros, having run out of data (the ranks that submitted
      // a mismatched one are told why it failed).
      if (c.mismatch.empty()) runnable.push_back(std::move(c));
      continue;
    }
    auto it = pending.find(c.name);
    if (it == pending.end()) {
      throw ProtocolError("the ranks agreed to run '" + c.name + "', which rank " +
                          std::to_string(rank) + " never submitted");
    }
    Request& r = it->second;
    if (!c.mismatch.empty()) {
      Finish(r, Failure{ErrorKind::kInvalid, c.mismatch}.For(r.state->what));
      continue;
    }
    if (r.desc.kind == OpKind::kRefused) {  // every rank refused it
      Finish(r, Failure{ErrorKind::kInvalid, "every rank submitted '" + c.name +
                                                 "' again while its earlier one was in flight"}
                    .For(r.state->what));
      continue;
    }
    if (r.desc.kind != OpKind::kAllreduce) {
      singles.emplace_back(&r, &c);
      continue;
    }
    runnable.push_back(std::move(c));
  }
  RunFirstBatch();

  for (auto [r, c] : singles) {
    switch (r->desc.kind) {
      case OpKind::kAllgather:
        RunAllgather(*r, *c);
        break;
      case OpKind::kBroadcast:
        RunBroadcast(*r);
        break;
      case OpKind::kAlltoall:
        RunAlltoall(*r, *c);
        break;
      case OpKind::kReducescatter:
        RunReducescatter(*r);
        break;
      default:  // a barrier: that every rank submitted it is all it needs
        Finish(*r);
    }
  }
}

void Engine::Impl::CompleteJoin(std::exception_ptr error, int last_rank) {
  std::shared_ptr<Handle::State> state;
  {
    std::lock_guard<std::mutex> lock(mutex);
    state = std::move(join);
  }
  if (!state) return;
  const float last = static_cast<float>(last_rank);
  state->Complete(std::move(error), error ? Array() : Array::FromFloats({&last, 1}));
}

DeviceCommunicator& Engine::Impl::Nccl() {
  if (!nccl) {
    int device = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      device = nccl_device;
    }
    if (device < 0) {
      // A rank that has joined before submitting any CUDA collective: the GPU its local rank
      // would use, as a launcher assigns them.
      const int count = cuda::DeviceCount();
      if (count == 0)
        throw InvalidArgument("NCCL: this rank has no CUDA device (" + cuda::Unavailable() + ")");
      device = backend->local_rank() % count;
    }
    nccl = CreateNcclCommunicator(backend, device, config.collective_timeout, nccl_abort,
                                  config.nccl_hierarchical);
  }
  return *nccl;
}

void Engine::Impl::FailWhatShutDownRanksMiss(const std::vector<RoundMessage>& round) {
  std::vector<int> gone;
  for (int r = 0; r < size; ++r) {
    if (round[r].shutting_down) gone.push_back(r);
  }
  if (gone.empty()) return;
  const auto left_out = [&](const std::vector<int>& missing) {
    std::vector<int> left;
    for (int r : missing) {
      if (round[r].shutting_down) left.push_back(r);
    }
    return left;
  };
  std::vector<std::pair<std::string, std::vector<int>>> doomed;
  for (const auto& [name, r] : pending) {
    auto left = left_out(table.MissingRanks(name));
    if (!left.empty()) doomed.emplace_back(name, std::move(left));
  }
  for (const auto& [name, left] : doomed) {
    Request& r = pending.at(name);
    Finish(r, Failure{ErrorKind::kPeer, RankList(left) +
                                            " shut down the collectives (hvd.shutdown() or the "
                                            "end of the process) without submitting it"}
                  .For(r.state->what));
  }
  bool joining = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    joining = join != nullptr;
  }
  if (!joining) return;
  std::vector<int> never_joining;
  for (int r : gone) {
    if (!table.HasJoined(r)) never_joining.push_back(r);
  }
  if (!never_joining.empty()) {
    CompleteJoin(Failure{ErrorKind::kPeer,
                         RankList(never_joining) + " shut down the collectives without joining"}
                     .For("join"));
  }
}

void Engine::Impl::Finish(Request& r, std::exception_ptr error, Array result) {
  auto state = r.state;
  const std::string name = r.name;
  pending.erase(name);  // `r` may be the pending entry: not used below
  {
    // Before completing: a caller that resubmits the name right after Wait must be accepted.
    std::lock_guard<std::mutex> lock(mutex);
    in_flight.erase(name);
    // A refusal waiting for this collective goes out in the next round.
    auto next = refused.find(name);
    if (next != refused.end()) {
      in_flight.emplace(name, next->second.front().state);
      queue.push_back(std::move(next->second.front()));
      next->second.pop_front();
      if (next->second.empty()) refused.erase(next);
    }
  }
  if (state->Complete(std::move(error), std::move(result))) {
    collectives.fetch_add(1, std::memory_order_relaxed);
  }
}

void Engine::Impl::Abandon(const Failure& f) {
  std::vector<std::shared_ptr<Handle::State>> states;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (failure) return;
    failure = f;
    nccl_abort.store(true);
    for (auto& [name, state] : in_flight) states.push_back(state);
    if (join) states.push_back(join);
  }
  DTRAIN_LOG(kError) << "collectives: " << f.message;
  for (auto& state : states) {
    if (state->Complete(f.For(state->what))) collectives.fetch_add(1, std::memory_order_relaxed);
  }
}

std::vector<Request> Engine::Impl::TakeUnannounced() {
  std::vector<Request> taken;
  for (auto* requests : {&queue, &held}) {
    for (auto& r : *requests) taken.push_back(std::move(r));
    requests->clear();
  }
  return taken;
}

void Engine::Impl::FailAll(const Failure& f) {
  std::vector<Request> failed;
  {
    std::lock_guard<std::mutex> lock(mutex);
    failure = f;
    failed = TakeUnannounced();
    refused.clear();  // their handles have no waiters
  }
  CompleteJoin(f.For("join"));
  for (auto& [name, r] : pending) failed.push_back(std::move(r));
  pending.clear();
  runnable.clear();
  for (auto& r : failed) Finish(r, f.For(r.state->what));
}

// ---------------------------------------------------------------------------------------------

namespace {

std::string PlaceText(const Array& a) {
  return a.on_device() ? " on GPU " + std::to_string(a.device()) : " in host memory";
}

Request MakeRequest(const std::string& name, OpKind kind, const Array& in, const Array& out,
                    ReduceOp op, int root, Duration timeout) {
  Request r;
  r.name = name;
  r.desc.kind = kind;
  r.desc.dtype = in.dtype();
  r.desc.op = op;
  r.desc.root = root;
  r.desc.shape = in.shape();
  r.desc.on_device = in.on_device();
  r.in = in;
  r.out = out;
  std::string what = std::string(OpKindName(kind)) + " '" + name + "'";
  if (name.empty() || name.size() > kMaxNameLength) {
    throw InvalidArgument(what + ": a collective's name must have 1 to " +
                          std::to_string(kMaxNameLength) + " characters");
  }
  if (in.shape().size() > kMaxDimensions) {
    throw InvalidArgument(what + ": more than " + std::to_string(kMaxDimensions) + " dimensions");
  }
  if (in.size() > 0 && !in.defined()) throw InvalidArgument(what + ": the input array is empty");
  r.state = std::make_shared<Handle::State>(std::move(what), timeout);
  return r;
}

// Alltoall and reducescatter run on host memory only: front ends stage CUDA tensors.
void RefuseDevice(const Request& r, const Array& in) {
  if (in.on_device()) {
    throw InvalidArgument(r.state->what +
                          ": its tensor is in GPU memory; alltoall and reducescatter take host "
                          "memory (copy it to the host first; dtrain.torch does)");
  }
}

// What Adasum cannot take, said before any rank waits for it (adasum.h).
void RefuseForAdasum(const Request& r, const Array& in, int ranks) {
  if (!AdasumTakes(in.dtype())) {
    const std::string dtype(DTypeName(in.dtype()));
    throw InvalidArgument(r.state->what +
                          ": Adasum reduces float16, float32 and float64 values, not " + dtype);
  }
  if (in.on_device()) {
    throw InvalidArgument(r.state->what +
                          ": Adasum runs in host memory (copy the tensor to the host first; "
                          "dtrain.torch does)");
  }
  if (!IsPowerOfTwo(ranks)) {
    const std::string has = "; this job (or process set) has " + std::to_string(ranks);
    throw InvalidArgument(r.state->what + ": Adasum needs a power-of-two number of ranks" + has);
  }
}

}  // namespace

Engine::Engine(std::shared_ptr<Communicator> backend, const CollectivesConfig& config)
    : backend_(backend), impl_(std::make_shared<Impl>(std::move(backend), config)) {
  backend_->SetPeerLostListener([weak = std::weak_ptr<Impl>(impl_)](const std::string& what) {
    if (auto impl = weak.lock()) impl->Abandon(Failure{ErrorKind::kPeer, what});
  });
  thread_ = std::thread([impl = impl_] { impl->Run(); });
}

Engine::~Engine() {
  Shutdown();
  backend_->SetPeerLostListener(nullptr);
}

Handle Engine::Allreduce(const std::string& name, const Array& in, const Array& out, ReduceOp op,
                         int priority) {
  Request r =
      MakeRequest(name, OpKind::kAllreduce, in, out, op, 0, impl_->config.collective_timeout);
  r.desc.priority = priority;
  if (out.size() != in.size() || out.dtype() != in.dtype() || (out.size() > 0 && !out.defined()) ||
      out.device() != in.device()) {
    throw InvalidArgument(r.state->what + ": output " + ShapeToString(out.shape()) + " " +
                          std::string(DTypeName(out.dtype())) + PlaceText(out) +
                          " does not match input " + ShapeToString(in.shape()) + " " +
                          std::string(DTypeName(in.dtype())) + PlaceText(in));
  }
  if (op == ReduceOp::kAdasum) RefuseForAdasum(r, in, impl_->size);
  return impl_->Submit(std::move(r));
}

Handle Engine::Allgather(const std::string& name, const Array& in) {
  Request r = MakeRequest(name, OpKind::kAllgather, in, in, ReduceOp::kSum, 0,
                          impl_->config.collective_timeout);
  if (in.shape().empty()) {
    throw InvalidArgument(r.state->what +
                          ": allgather needs at least one dimension to concatenate");
  }
  return impl_->Submit(std::move(r));
}

Handle Engine::Broadcast(const std::string& name, const Array& inout, int root) {
  Request r = MakeRequest(name, OpKind::kBroadcast, inout, inout, ReduceOp::kSum, root,
                          impl_->config.collective_timeout);
  if (root < 0 || root >= impl_->size) {
    throw InvalidArgument(r.state->what + ": root " + std::to_string(root) +
                          " is not a rank of this job of " + std::to_string(impl_->size));
  }
  return impl_->Submit(std::move(r));
}

Handle Engine::Alltoall(const std::string& name, const Array& in,
                        const std::vector<int64_t>& splits) {
  Request r = MakeRequest(name, OpKind::kAlltoall, in, in, ReduceOp::kSum, 0,
                          impl_->config.collective_timeout);
  RefuseDevice(r, in);
  if (in.shape().empty()) {
    throw InvalidArgument(r.state->what + ": alltoall needs at least one dimension to split");
  }
  r.desc.splits = splits;
  if (!SplitsFit(r.desc, impl_->size)) {
    throw InvalidArgument(r.state->what + ": splits " + ShapeToString(splits) +
                          " must give each of the " + std::to_string(impl_->size) +
                          " ranks a count of rows, adding up to the first dimension of " +
                          ShapeToString(in.shape()));
  }
  return impl_->Submit(std::move(r));
}

Handle Engine::Reducescatter(const std::string& name, const Array& in, ReduceOp op) {
  Request r =
      MakeRequest(name, OpKind::kReducescatter, in, in, op, 0, impl_->config.collective_timeout);
  RefuseDevice(r, in);
  if (op == ReduceOp::kAdasum) {
    throw InvalidArgument(r.state->what +
                          ": reducescatter sums, averages, or takes the min, max or product; "
                          "Adasum is for allreduce");
  }
  if (in.shape().empty()) {
    throw InvalidArgument(r.state->what +
                          ": reducescatter needs at least one dimension to scatter (a scalar "
                          "cannot be divided among the ranks)");
  }
  return impl_->Submit(std::move(r));
}

void Engine::Refuse(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return;  // Submit refuses such names anyway
  try {
    impl_->Submit(Refusal(name, "'" + name + "'", impl_->config.collective_timeout));
  } catch (const InvalidArgument&) {
    // This rank's collective of the name is in flight: Submit queued the refusal behind it.
  }
}

Handle Engine::Barrier() {
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    n = impl_->barriers++;
  }
  Request r = MakeRequest("dtrain.barrier." + std::to_string(n), OpKind::kBarrier, Array(), Array(),
                          ReduceOp::kSum, 0, impl_->config.collective_timeout);
  return impl_->Submit(std::move(r));
}

Handle Engine::Join() {
  auto state = std::make_shared<Handle::State>("join", impl_->config.collective_timeout);
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (impl_->failure) {
    const Failure f = *impl_->failure;
    lock.unlock();
    state->Complete(f.For("join"));
    return Handle(state);
  }
  if (impl_->join) throw InvalidArgument("join: this rank has already joined");
  impl_->join = state;
  impl_->announce_join = true;
  lock.unlock();
  impl_->wake.notify_one();
  return Handle(state);
}

void Engine::Shutdown() {
  std::lock_guard<std::mutex> once(shutdown_mutex_);
  if (!thread_.joinable()) return;
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (!impl_->shutdown_requested) {
    impl_->ReleaseHeld();  // what a hold kept back is the job's too (Shutdown's contract)
    impl_->shutdown_requested = true;
    impl_->shutdown_deadline = Clock::now() + impl_->config.collective_timeout;
  }
  impl_->wake.notify_all();
  // The thread leaves by the shutdown deadline unless a backend call blocks without a timeout
  // (MPI), or is stuck waiting for a rank that died (Abandon): then it is left behind, holding
  // the backend, rather than hanging the process.
  const auto give_up = impl_->failure ? Clock::now() + kFailedShutdownGrace
                                      : impl_->shutdown_deadline + Duration(5000);
  const bool finished =
      impl_->finished_cv.wait_until(lock, give_up, [&] { return impl_->finished; });
  lock.unlock();
  if (finished) {
    thread_.join();
  } else {
    DTRAIN_LOG(kError) << "collectives: the engine thread is stuck in a backend call; leaving it";
    thread_.detach();
  }
}

bool Engine::nccl_enabled() const { return impl_->config.nccl; }

EngineStats Engine::stats() const {
  EngineStats s;
  s.rounds = impl_->rounds.load();
  s.data_calls = impl_->data_calls.load();
  s.collectives = impl_->collectives.load();
  s.fused_tensors = impl_->fused_tensors.load();
  s.caller_rounds = impl_->caller_rounds.load();
  return s;
}

}  // namespace dtrain::collectives

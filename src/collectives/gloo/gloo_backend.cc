// The Gloo backend: collectives over the TCP pairs between every two ranks that JoinGloo
// (gloo_setup.h) connected, or through the hosts' shared memory groups (host_groups.h).
//
// Timeouts: the rendezvous waits at most DTRAIN_CONNECT_TIMEOUT_MS for the other ranks; every
// collective at most DTRAIN_COLLECTIVE_TIMEOUT_MS (gloo's context timeout). A rank that dies
// closes its sockets, so its peers fail at once; this rank then closes its own connections too,
// so that ranks blocked on *it* fail at once instead of at the timeout, and asks the rendezvous
// host which rank left first to name it.
//
// Allreduce algorithm (DTRAIN_GLOO_ALGORITHM; default "auto"), measured with
// bench/allreduce_bench.sh on 2 local processes, float32, median of many calls:
//
//                     4 KB    64 KB   1 MB    4 MB    16 MB    64 MB
//   ring              244us   269us   584us   2.5ms   12.4ms   43.6ms
//   bcube             176us   224us   442us   2.1ms   11.4ms   61.8ms
//   ring_chunked      242us   281us   616us   4.1ms   14.0ms   53.6ms  (16 KB: 45-90 ms stalls)
//   halving_doubling  166us   196us   477us   2.0ms   10.7ms   50.5ms
//
// "auto" takes bcube below 16 MB and ring from there: both are gloo's option-based algorithms,
// which bind to any buffer per call. The class-based ring_chunked and halving_doubling must be
// built per buffer (their inboxes allocated, their slots registered); halving_doubling's small
// lead at small sizes does not pay for that with fusion buffers of changing size.
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <thread>

#include "collectives/backend.h"
#include "collectives/error_text.h"
#include "collectives/gloo/gloo_setup.h"
#include "collectives/gloo/gloo_watchdog.h"
#include "collectives/gloo/host_groups.h"
#include "collectives/gloo/rendezvous_client.h"
#include "common/elementwise.h"
#include "common/logging.h"
#include "dtrain/common/error.h"
#include "report/reporter.h"

namespace dtrain::collectives {
namespace {

constexpr size_t kAutoRingFromBytes = size_t{16} << 20;
// Allgathers whose every block is at most this go to every peer directly (GlooAllgathervDirect).
constexpr size_t kDirectAllgatherMaxBytes = size_t{64} << 10;

bool IsTimeout(const std::exception& e) {
  return std::string_view(e.what()).find("Timed out") != std::string_view::npos;
}

// The reduction of the new-style gloo API: out = a (how) b for the dtype's elements.
gloo::AllreduceOptions::Func ReduceFunction(DType dtype, Reduction how) {
  if (how == Reduction::kSum) {
    return [dtype](void* out, const void* a, const void* b, size_t n) { Sum(out, a, b, n, dtype); };
  }
  return [dtype, how](void* out, const void* a, const void* b, size_t n) {
    Reduce(out, a, b, n, dtype, how);
  };
}

class GlooBackend final : public Communicator, private LeaderChannel {
 public:
  // The whole job: joins the mesh (gloo_setup.h).
  // `server`: rank 0's rendezvous, already open (an elastic job's), or null.
  GlooBackend(const CollectivesConfig& config, std::unique_ptr<RendezvousServer> server)
      : GlooBackend(JoinGloo(config, std::move(server)), config) {}

  // A process set: `members` (ranks of the job, ascending, this one among them) connect a gloo
  // context of their own over the job's rendezvous and devices, under `prefix` in the store.
  GlooBackend(std::shared_ptr<GlooMembership> mesh, std::vector<int> members,
              const std::string& prefix, const CollectivesConfig& config)
      : algorithm_(config.gloo_algorithm.empty() ? "auto" : config.gloo_algorithm),
        timeout_(config.collective_timeout),
        config_(config),
        mesh_(std::move(mesh)),
        members_(std::move(members)) {
    global_rank_ = config.rank;
    rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), global_rank_) -
                             members_.begin());
    size_ = static_cast<int>(members_.size());
    set_store_ = std::make_unique<gloo::rendezvous::PrefixStore>(prefix, *mesh_->store);
    try {
      auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      context->setTimeout(config.collective_timeout);
      context->connectFullMesh(*set_store_, mesh_->device);
      context_ = std::move(context);
    } catch (const gloo::Exception& e) {
      throw PeerError("rank " + std::to_string(global_rank_) +
                      " could not connect to the other gloo ranks of its process set (" +
                      mesh_->address + "): " + e.what());
    }
    Start(*set_store_);
  }

  // config_.rank is this process's rank in the job, in a set's communicator too.
  std::unique_ptr<Communicator> Subset(const std::vector<int>& ranks, int generation) override {
    return std::make_unique<GlooBackend>(mesh_, ranks, "process-set-" + std::to_string(generation),
                                         config_);
  }

 private:
  GlooBackend(std::unique_ptr<GlooMembership> mesh, const CollectivesConfig& config)
      : algorithm_(config.gloo_algorithm.empty() ? "auto" : config.gloo_algorithm),
        timeout_(config.collective_timeout),
        config_(config),
        mesh_(std::move(mesh)) {
    global_rank_ = rank_ = config.rank;
    size_ = config.size;
    members_.resize(size_);
    std::iota(members_.begin(), members_.end(), 0);
    context_ = mesh_->context;
    Start(*mesh_->store);
  }

  // What both constructors do once `context_` connects this communicator's ranks: the layout of
  // its hosts, the watchdog, the shared memory groups.
  void Start(gloo::rendezvous::Store& store) {
    std::vector<std::string> hostnames, host_ids;
    for (int member : members_) {
      hostnames.push_back(mesh_->hostnames[member]);
      host_ids.push_back(mesh_->host_ids[member]);
    }
    const HostLayout by_name = HostLayout::FromHostIds(hostnames, rank_);
    local_rank_ = by_name.local_rank;
    local_size_ = static_cast<int>(by_name.mine().size());
    if (mesh_->client) {
      // Only the TCP rendezvous knows who left; under a FileStore a stuck call ends at the
      // timeout.
      watchdog_ =
          std::make_unique<GlooWatchdog>([this] { return LostRanksText(Duration(0)); },
                                         [this](const std::string& lost) { NotifyPeerLost(lost); });
    }
    SetUpSharedMemory(store, config_, host_ids);
    DTRAIN_LOG(kConnections) << "collectives: gloo rank " << rank_ << " of " << size_
                             << (size_ == config_.size ? "" : " (a process set)") << " at "
                             << mesh_->address << " (local " << local_rank_ << " of " << local_size_
                             << "), "
                             << (!groups_ ? "allreduce " + algorithm_
                                 : groups_->layout().hosts() == 1
                                     ? "shared memory among all ranks"
                                     : "hierarchical allreduce over " +
                                           std::to_string(groups_->layout().hosts()) +
                                           " hosts, shared memory within each");
  }

 public:
  ~GlooBackend() override {
    groups_.reset();
    watchdog_.reset();  // its thread asks the rendezvous client
    cached_.clear();
    leaders_.reset();
    context_.reset();
    set_store_.reset();
    mesh_.reset();  // the rendezvous client says goodbye before rank 0's server goes away
  }

  BackendKind kind() const override { return BackendKind::kGloo; }

 protected:
  void DoAllreduce(const void* in, void* out, size_t count, DType dtype, Reduction how) override {
    if (groups_) {
      return GroupsCall("allreduce", [&] { groups_->Allreduce(in, out, count, dtype, how); });
    }
    Guard("allreduce", [&] {
      // The class-based algorithms only sum.
      const bool old_style = how == Reduction::kSum &&
                             (algorithm_ == "ring_chunked" || algorithm_ == "halving_doubling");
      if (old_style && count <= static_cast<size_t>(INT32_MAX) && dtype != DType::kBFloat16) {
        // The class-based algorithms reduce their own buffer in place; building one registers
        // it with every pair (in a slot every rank must number alike), so it is kept for the next
        // call of the same size and dtype, which every rank makes at the same point.
        Cached& cached = CachedAlgorithm(count, dtype);
        const size_t bytes = count * DTypeSize(dtype);
        std::memcpy(cached.buffer.data(), in, bytes);
        cached.algorithm->run();
        std::memcpy(out, cached.buffer.data(), bytes);
        return;
      }
      GlooAllreduce(context_, in, out, count, dtype, how);
    });
  }

  void DoAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    if (groups_) return GroupsCall("allgather", [&] { groups_->Allgatherv(in, out, bytes); });
    Guard("allgather", [&] { GlooAllgatherv(context_, in, out, bytes); });
  }

  void DoBroadcast(void* data, size_t bytes, int root) override {
    if (groups_) return GroupsCall("broadcast", [&] { groups_->Broadcast(data, bytes, root); });
    Guard("broadcast", [&] { GlooBroadcast(context_, data, bytes, root); });
  }

  // Through the host's shared memory where every rank shares it (each byte written to the
  // segment once and read once, instead of through the kernel's loopback and gloo's event loop);
  // over the TCP pairs between every two ranks otherwise.
  void DoAlltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override {
    if (groups_ && groups_->one_host()) {
      return GroupsCall("alltoall", [&] { groups_->Alltoallv(in, send_bytes, out, recv_bytes); });
    }
    Guard("alltoall", [&] { GlooAlltoallv(context_, in, send_bytes, out, recv_bytes); });
  }

  void DoBarrier() override {
    if (groups_) return GroupsCall("barrier", [&] { groups_->Barrier(); });
    Guard("barrier", [&] { GlooBarrier(context_); });
  }

 private:
  template <typename T>
  static void SetBuffers(gloo::AllreduceOptions& opts,
                         std::unique_ptr<gloo::transport::UnboundBuffer> input,
                         std::unique_ptr<gloo::transport::UnboundBuffer> output) {
    if (input) opts.setInput<T>(std::move(input));
    opts.setOutput<T>(std::move(output));
  }

  // A gloo buffer over our memory, listed in `watched` for the watchdog to abort its waits.
  std::unique_ptr<gloo::transport::UnboundBuffer> Buffer(
      void* data, size_t bytes, std::vector<gloo::transport::UnboundBuffer*>* watched,
      const std::shared_ptr<gloo::Context>& context) {
    auto buffer = context->createUnboundBuffer(data, bytes);
    watched->push_back(buffer.get());
    return buffer;
  }

  // gloo's option-based allreduce (bcube or ring, DTRAIN_GLOO_ALGORITHM) among `context`'s ranks.
  void GlooAllreduce(const std::shared_ptr<gloo::Context>& context, const void* in, void* out,
                     size_t count, DType dtype, Reduction how) {
    const bool bcube = algorithm_ == "bcube" ||
                       (algorithm_ == "auto" && count * DTypeSize(dtype) < kAutoRingFromBytes);
    gloo::AllreduceOptions opts(context);
    opts.setAlgorithm(bcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                            : gloo::AllreduceOptions::Algorithm::RING);
    const size_t bytes = count * DTypeSize(dtype);
    std::vector<gloo::transport::UnboundBuffer*> watched;
    auto output = Buffer(out, bytes, &watched, context);
    // Without an input gloo reduces the output in place.
    auto input = in == out ? nullptr : Buffer(const_cast<void*>(in), bytes, &watched, context);
    switch (dtype) {
      case DType::kFloat32:
        SetBuffers<float>(opts, std::move(input), std::move(output));
        break;
      case DType::kFloat64:
        SetBuffers<double>(opts, std::move(input), std::move(output));
        break;
      default:  // the two half types: only their size matters to gloo
        SetBuffers<uint16_t>(opts, std::move(input), std::move(output));
    }
    opts.setReduceFunction(ReduceFunction(dtype, how));
    opts.setTimeout(timeout_);
    // After the options that own the buffers, so that it ends before they do.
    GlooWatchdog::Call watch(watchdog_.get(), std::move(watched));
    gloo::allreduce(opts);
  }

  void GlooAllgatherv(const std::shared_ptr<gloo::Context>& context, const void* in, void* out,
                      const std::vector<size_t>& bytes) {
    if (SendsDirectly(bytes)) return GlooAllgathervDirect(context, in, out, bytes);
    gloo::AllgathervOptions opts(context);
    // Gloo wants a buffer even for an empty contribution.
    static char empty = 0;
    const size_t mine = bytes[context->rank];
    size_t total = 0;
    for (size_t b : bytes) total += b;
    std::vector<gloo::transport::UnboundBuffer*> watched;
    opts.setInput<char>(Buffer(mine ? const_cast<void*>(in) : &empty, mine, &watched, context));
    opts.setOutput<char>(Buffer(total ? out : &empty, total, &watched, context), bytes);
    opts.setTimeout(timeout_);
    // After the options that own the buffers, so that it ends before they do.
    GlooWatchdog::Call watch(watchdog_.get(), std::move(watched));
    gloo::allgatherv(opts);
  }

  // Gloo's allgatherv is a ring: size - 1 steps, each a hop between two ranks and their threads'
  // wake-ups. For small blocks (the engine's negotiation rounds above all, during which the links
  // idle) that latency is the cost. Sending this rank's block to every peer at once (gloo's
  // alltoallv, the block repeated once per peer) puts the same bytes on each link in one hop: at 8
  // emulated hosts a negotiation round took 2.7 ms (median) from the last rank's arrival, against
  // 5.6 around the ring.
  static bool SendsDirectly(const std::vector<size_t>& bytes) {
    return bytes.size() > 2 && std::all_of(bytes.begin(), bytes.end(), [](size_t b) {
             return b > 0 && b <= kDirectAllgatherMaxBytes;
           });
  }

  void GlooAllgathervDirect(const std::shared_ptr<gloo::Context>& context, const void* in,
                            void* out, const std::vector<size_t>& bytes) {
    const size_t mine = bytes[context->rank];
    direct_input_.resize(mine * bytes.size());
    for (size_t r = 0; r < bytes.size(); ++r)
      std::memcpy(direct_input_.data() + r * mine, in, mine);
    size_t total = 0;
    for (size_t b : bytes) total += b;
    gloo::AlltoallvOptions opts(context);
    std::vector<gloo::transport::UnboundBuffer*> watched;
    opts.setInput<char>(Buffer(direct_input_.data(), direct_input_.size(), &watched, context),
                        std::vector<int64_t>(bytes.size(), static_cast<int64_t>(mine)));
    opts.setOutput<char>(Buffer(out, total, &watched, context),
                         std::vector<int64_t>(bytes.begin(), bytes.end()));
    opts.setTimeout(timeout_);
    // After the options that own the buffers, so that it ends before they do.
    GlooWatchdog::Call watch(watchdog_.get(), std::move(watched));
    gloo::alltoallv(opts);
  }

  void GlooAlltoallv(const std::shared_ptr<gloo::Context>& context, const void* in,
                     const std::vector<size_t>& send_bytes, void* out,
                     const std::vector<size_t>& recv_bytes) {
    // Gloo wants a buffer even when nothing moves.
    static char empty = 0;
    const size_t sent = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
    const size_t received = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
    gloo::AlltoallvOptions opts(context);
    std::vector<gloo::transport::UnboundBuffer*> watched;
    opts.setInput<char>(Buffer(sent ? const_cast<void*>(in) : &empty, sent, &watched, context),
                        std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
    opts.setOutput<char>(Buffer(received ? out : &empty, received, &watched, context),
                         std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
    opts.setTimeout(timeout_);
    // After the options that own the buffers, so that it ends before they do.
    GlooWatchdog::Call watch(watchdog_.get(), std::move(watched));
    gloo::alltoallv(opts);
  }

  void GlooBroadcast(const std::shared_ptr<gloo::Context>& context, void* data, size_t bytes,
                     int root) {
    gloo::BroadcastOptions opts(context);
    std::vector<gloo::transport::UnboundBuffer*> watched;
    opts.setOutput<char>(Buffer(data, bytes, &watched, context));
    opts.setRoot(root);
    opts.setTimeout(timeout_);
    // After the options that own the buffers, so that it ends before they do.
    GlooWatchdog::Call watch(watchdog_.get(), std::move(watched));
    gloo::broadcast(opts);
  }

  void GlooBarrier(const std::shared_ptr<gloo::Context>& context) {
    gloo::BarrierOptions opts(context);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  }

  // LeaderChannel (host_groups.h): gloo among the hosts' leaders.
  void LeadersAllreduce(void* data, size_t count, DType dtype, Reduction how) override {
    Guard("allreduce among the hosts' leaders",
          [&] { GlooAllreduce(leaders_, data, data, count, dtype, how); });
  }
  void LeadersAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    Guard("allgather among the hosts' leaders", [&] { GlooAllgatherv(leaders_, in, out, bytes); });
  }
  void LeadersBroadcast(void* data, size_t bytes, int root_host) override {
    Guard("broadcast among the hosts' leaders",
          [&] { GlooBroadcast(leaders_, data, bytes, root_host); });
  }
  void LeadersBarrier() override {
    Guard("barrier among the hosts' leaders", [&] { GlooBarrier(leaders_); });
  }

  // Runs one collective through the host groups. After an error (the group's, naming the rank, or
  // a leader's gloo call, which Guard has recorded) every later call fails the same way, and this
  // rank abandons its host's group so that the ranks there fail at once instead of waiting for it.
  template <typename Call>
  void GroupsCall(const char* what, Call&& call) {
    ThrowIfBroken();
    std::string error;
    try {
      call();
      return;
    } catch (const TimeoutError& e) {
      timed_out_ = true;
      error = e.what();
    } catch (const std::exception& e) {
      error = e.what();
    }
    groups_->Abandon(error);
    CloseConnections();
    if (failure_.empty()) {
      failure_ = std::string(what) + " (shared memory) failed on rank " +
                 std::to_string(global_rank_) + ": " + error;
    }
    if (timed_out_) throw TimeoutError(failure_);
    throw PeerError(failure_);
  }

  // Ranks that share a host exchange through their host's shared memory group (host_groups.h).
  // Each host's leader creates its group and always publishes the name ("" when it offers none)
  // so that nobody waits for it in vain; every rank then says through gloo whether it is ready,
  // and the groups are used only if all are (a full /dev/shm, or one rank with DTRAIN_GLOO_SHM=0,
  // leaves every rank on gloo alone).
  void SetUpSharedMemory(gloo::rendezvous::Store& store, const CollectivesConfig& config,
                         const std::vector<std::string>& host_ids) {
    if (size_ == 1) return;
    HostLayout layout = HostLayout::FromHostIds(host_ids, rank_);
    if (layout.hosts() == size_) return;  // one rank per host: nothing to share
    const bool wanted = config.shared_memory && algorithm_ == "auto";
    std::string why_not = !config.shared_memory ? "DTRAIN_GLOO_SHM=0"
                          : !wanted             ? "DTRAIN_GLOO_ALGORITHM=" + algorithm_
                                                : "";
    const std::vector<int> mine = layout.mine();
    const std::string key = std::string(kShmKey) + "/" + std::to_string(mine[0]);
    ShmGroupOptions options;
    options.rank = layout.local_rank;
    options.size = static_cast<int>(mine.size());
    options.timeout = config.collective_timeout;
    options.describe_rank = [this, mine](int r) { return Peer(mine[r]); };
    options.explain_loss = [this, mine](int r) {
      const std::string lost = LostRanksText(Duration(2000));
      return lost.empty() ? Peer(mine[r]) + " left the job (its process ended)" : lost;
    };
    options.lost_ranks = [this] { return LostRanksText(Duration(0)); };
    std::unique_ptr<ShmGroup> group;
    try {
      if (mine.size() > 1 && layout.leader()) {
        if (wanted) group = ShmGroup::Create(options);
        const std::string name = group ? group->name() : "";
        store.set(key, std::vector<char>(name.begin(), name.end()));
      } else if (mine.size() > 1) {
        store.wait({key}, config.connect_timeout);
        const auto bytes = store.get(key);
        const std::string name(bytes.begin(), bytes.end());
        if (wanted && !name.empty()) group = ShmGroup::Attach(name, options);
        if (wanted && name.empty()) why_not = Peer(mine[0]) + " offered no shared memory";
      }
    } catch (const std::exception& e) {
      group.reset();
      why_not = e.what();
    }
    const char ready = wanted && (group || mine.size() == 1) ? 1 : 0;
    std::vector<char> everyone(size_);
    DoAllgatherv(&ready, everyone.data(), std::vector<size_t>(size_, 1));  // over gloo
    if (std::count(everyone.begin(), everyone.end(), 1) != size_) {
      if (wanted && why_not.empty()) why_not = "another rank is not ready";
      if (wanted) {
        DTRAIN_LOG(kWarning) << "collectives: rank " << rank_
                             << " exchanges with the ranks of its host over gloo's loopback TCP, "
                                "not shared memory: "
                             << why_not;
      } else {
        DTRAIN_LOG(kConnections) << "collectives: no shared memory: " << why_not;
      }
      return;
    }
    if (group) group->Unlink();  // every rank of this host has it mapped
    if (layout.hosts() > 1 && layout.leader()) {
      try {
        gloo::rendezvous::PrefixStore prefixed("leaders", store);
        auto context = std::make_shared<gloo::rendezvous::Context>(layout.my_host, layout.hosts());
        context->setTimeout(config.collective_timeout);
        context->connectFullMesh(prefixed, mesh_->device);
        leaders_ = std::move(context);
      } catch (const gloo::Exception& e) {
        throw PeerError("rank " + std::to_string(global_rank_) +
                        " could not connect to the other hosts' leading gloo ranks (" +
                        mesh_->address + "): " + e.what());
      }
    }
    LeaderChannel* channel = leaders_ ? static_cast<LeaderChannel*>(this) : nullptr;
    groups_ = std::make_unique<HostGroups>(std::move(layout), std::move(group), channel);
  }

  // Keyed by what every rank agrees on (not by the caller's memory, whose address differs between
  // ranks: one rank reusing an instance while another built a new one would pair their slots
  // wrongly and hang both).
  struct Cached {
    std::vector<char> buffer;
    std::unique_ptr<gloo::Algorithm> algorithm;
  };

  Cached& CachedAlgorithm(size_t count, DType dtype) {
    const auto key = std::make_pair(count, dtype);
    auto it = cached_.find(key);
    if (it != cached_.end()) return it->second;
    // Each instance holds inboxes as large as its buffer: bound what the cache keeps.
    if (cached_bytes_ + count * DTypeSize(dtype) > kMaxCachedBytes) {
      cached_.clear();
      cached_bytes_ = 0;
    }
    cached_bytes_ += count * DTypeSize(dtype);
    Cached cached;
    cached.buffer.resize(std::max<size_t>(count * DTypeSize(dtype), 1));
    void* data = cached.buffer.data();
    const int n = static_cast<int>(count);
    if (dtype == DType::kFloat32) {
      cached.algorithm = Make<float>(data, n);
    } else if (dtype == DType::kFloat64) {
      cached.algorithm = Make<double>(data, n);
    } else {
      cached.algorithm = Make<gloo::float16>(data, n);
    }
    return cached_.emplace(key, std::move(cached)).first->second;
  }

  template <typename T>
  std::unique_ptr<gloo::Algorithm> Make(void* data, int count) {
    std::vector<T*> ptrs{static_cast<T*>(data)};
    if (algorithm_ == "halving_doubling") {
      return std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context_, ptrs, count);
    }
    return std::make_unique<gloo::AllreduceRingChunked<T>>(context_, ptrs, count);
  }

  // After a failure every call fails the same way: the ranks no longer agree on what was exchanged.
  void ThrowIfBroken() const {
    if (timed_out_) throw TimeoutError(failure_);
    if (!failure_.empty()) throw PeerError(failure_);
  }

  // Runs one gloo call; turns gloo's exceptions into ours, naming the rank that left.
  template <typename Call>
  void Guard(const char* what, Call&& call) {
    ThrowIfBroken();
    try {
      call();
    } catch (const std::exception& e) {
      Fail(what, e.what(), IsTimeout(e));
    }
    // An aborted call may return normally, with whatever its buffers held.
    if (watchdog_ && !watchdog_->found().empty())
      Fail(what, "a wait aborted by the watchdog", false);
  }

  [[noreturn]] void Fail(const char* what, const std::string& gloo_error, bool timeout) {
    // Our peers may be blocked on us: close every connection so that they fail now too.
    cached_.clear();
    cached_bytes_ = 0;
    CloseConnections();
    std::string cause;
    if (!timeout) {
      cause = watchdog_ ? watchdog_->found() : "";
      if (cause.empty()) cause = LostRanksText(Duration(2000));
    }
    failure_ = "gloo " + std::string(what) + " failed on rank " + std::to_string(global_rank_) +
               ": " +
               (timeout ? "no progress within " + SecondsText(timeout_) +
                              " (DTRAIN_COLLECTIVE_TIMEOUT_MS); a rank is stuck or far behind"
                : cause.empty() ? "a connection broke"
                                : cause) +
               " (gloo: " + gloo_error + ")";
    if (timeout) {
      timed_out_ = true;
      throw TimeoutError(failure_);
    }
    throw PeerError(failure_);
  }

  // "rank 2 (host) left the job" from the rendezvous host's record of dropped connections.
  // The dead rank's connection to rank 0 drops at the same moment as its gloo pairs: `grace`
  // gives rank 0 a moment to notice. "" when nobody left (or nobody can tell: no TCP rendezvous).
  std::string LostRanksText(Duration grace) {
    RendezvousClient* client = mesh_->client.get();
    if (!client) return {};
    const Deadline deadline(grace);
    try {
      while (true) {
        auto lost = client->LostRanks(Duration(2000));
        std::erase_if(lost, [this](const LostRank& l) {
          return l.rank == global_rank_ || l.rank < 0 ||
                 static_cast<size_t>(l.rank) >= mesh_->peers.size();
        });
        if (!lost.empty()) {
          std::string text;
          for (size_t i = 0; i < lost.size(); ++i) {
            const char* separator = i == 0 ? "" : i == 1 ? "; then " : "; ";
            text += separator + mesh_->peers[lost[i].rank] + " " + lost[i].why;
          }
          // The launcher names the rank the job failed for from this record.
          static std::once_flag reported;
          std::call_once(reported, [&] {
            report::Send({{"kind", "failure"},
                          {"node", {{"role", "worker"}, {"rank", lost[0].rank}}},
                          {"cause", lost[0].why}});
          });
          return text;
        }
        if (deadline.passed()) return {};
        std::this_thread::sleep_for(Duration(50));
      }
    } catch (const Error&) {
      return mesh_->peers[0] + ", the rendezvous host at " + client->endpoint() +
             ", left the job or stopped answering";
    }
  }

  // "rank 1 (host, address)" for this communicator's rank `r`, named by its rank in the job.
  const std::string& Peer(int r) const { return mesh_->peers[members_[r]]; }

  void CloseConnections() {
    context_->closeConnections();
    if (leaders_) leaders_->closeConnections();
  }

  static constexpr size_t kMaxCachedBytes = size_t{256} << 20;
  static constexpr const char* kShmKey = "shared-memory";

  std::string algorithm_;
  Duration timeout_;
  CollectivesConfig config_;
  // The rendezvous, the job's pairs, who is who: shared with the process sets' communicators.
  std::shared_ptr<GlooMembership> mesh_;
  std::vector<int> members_;  // this communicator's ranks, as ranks of the job
  int global_rank_ = 0;       // this process's rank in the job
  std::unique_ptr<gloo::rendezvous::PrefixStore> set_store_;  // a process set's part of the store
  std::shared_ptr<gloo::Context> context_;                    // among members_
  std::map<std::pair<size_t, DType>, Cached> cached_;
  size_t cached_bytes_ = 0;  // buffer bytes of the cached instances
  std::string failure_;
  bool timed_out_ = false;
  std::unique_ptr<GlooWatchdog> watchdog_;  // with a TCP rendezvous only
  std::shared_ptr<gloo::Context> leaders_;  // one rank per host; set on those ranks only
  std::unique_ptr<HostGroups> groups_;      // the collectives' path when set
  std::vector<char> direct_input_;  // GlooAllgathervDirect's: this rank's block once per rank
};

}  // namespace

std::unique_ptr<Communicator> CreateGlooBackend(const CollectivesConfig& config,
                                                std::unique_ptr<RendezvousServer> server) {
  return std::make_unique<GlooBackend>(config, std::move(server));
}

}  // namespace dtrain::collectives

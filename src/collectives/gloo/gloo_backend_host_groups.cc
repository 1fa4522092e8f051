// GlooBackend's shared memory path (gloo_backend.h): setting up the hosts' groups (host_groups.h),
// a collective through them, and gloo among the hosts' leaders, the groups' LeaderChannel.
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>

#include <algorithm>

#include "collectives/gloo/gloo_backend.h"
#include "collectives/gloo/pair_sockets.h"
#include "common/logging.h"

namespace dtrain::collectives {
namespace {

// Where each host's leader publishes its group's name in the store.
constexpr const char* kShmKey = "shared-memory";

}  // namespace

void GlooBackend::SetUpSharedMemory(gloo::rendezvous::Store& store, const CollectivesConfig& config,
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
      leaders_sockets_ = ConnectFullMesh(*context, prefixed, mesh_->device);
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

void GlooBackend::GroupsFailed(const char* what, const std::string& error, bool timed_out) {
  if (timed_out) timed_out_ = true;
  groups_->Abandon(error);
  CloseConnections();
  if (failure_.empty()) {
    failure_ = std::string(what) + " (shared memory) failed on rank " +
               std::to_string(global_rank_) + ": " + error;
  }
  if (timed_out_) throw TimeoutError(failure_);
  throw PeerError(failure_);
}

void GlooBackend::LeadersAllreduce(void* data, size_t count, DType dtype, Reduction how) {
  Guard("allreduce among the hosts' leaders",
        [&] { GlooAllreduce(leaders_, Among::kLeaders, data, data, count, dtype, how); });
}

void GlooBackend::LeadersAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  Guard("allgather among the hosts' leaders", [&] { GlooAllgatherv(leaders_, in, out, bytes); });
}

void GlooBackend::LeadersBroadcast(void* data, size_t bytes, int root_host) {
  Guard("broadcast among the hosts' leaders",
        [&] { GlooBroadcast(leaders_, data, bytes, root_host); });
}

void GlooBackend::LeadersBarrier() {
  Guard("barrier among the hosts' leaders", [&] { GlooBarrier(leaders_); });
}

}  // namespace dtrain::collectives

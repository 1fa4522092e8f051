// GlooBackend (gloo_backend.h): joining, teardown, process sets, and the path each call takes.
#include "collectives/gloo/gloo_backend.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "collectives/gloo/pair_sockets.h"
#include "common/logging.h"

namespace dtrain::collectives {

GlooBackend::GlooBackend(const CollectivesConfig& config, std::unique_ptr<RendezvousServer> server)
    : GlooBackend(JoinGloo(config, std::move(server)), config) {}

GlooBackend::GlooBackend(std::shared_ptr<GlooMembership> mesh, std::vector<int> members,
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
    members_sockets_ = ConnectFullMesh(*context, *set_store_, mesh_->device);
    context_ = std::move(context);
  } catch (const gloo::Exception& e) {
    throw PeerError("rank " + std::to_string(global_rank_) +
                    " could not connect to the other gloo ranks of its process set (" +
                    mesh_->address + "): " + e.what());
  }
  Start(*set_store_);
}

std::unique_ptr<Communicator> GlooBackend::Subset(const std::vector<int>& ranks, int generation) {
  return std::make_unique<GlooBackend>(mesh_, ranks, "process-set-" + std::to_string(generation),
                                       config_);
}

GlooBackend::GlooBackend(std::unique_ptr<GlooMembership> mesh, const CollectivesConfig& config)
    : algorithm_(config.gloo_algorithm.empty() ? "auto" : config.gloo_algorithm),
      timeout_(config.collective_timeout),
      config_(config),
      mesh_(std::move(mesh)) {
  global_rank_ = rank_ = config.rank;
  size_ = config.size;
  members_.resize(size_);
  std::iota(members_.begin(), members_.end(), 0);
  context_ = mesh_->context;
  members_sockets_ = mesh_->pair_sockets;
  Start(*mesh_->store);
}

void GlooBackend::Start(gloo::rendezvous::Store& store) {
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

GlooBackend::~GlooBackend() {
  groups_.reset();
  watchdog_.reset();  // its thread asks the rendezvous client
  cached_.clear();
  leaders_.reset();
  context_.reset();
  set_store_.reset();
  mesh_.reset();  // the rendezvous client says goodbye before rank 0's server goes away
}

bool GlooBackend::DoAllreducePieces(std::span<const AllreducePiece> pieces, DType dtype,
                                    Reduction how, double scale) {
  if (!groups_ || !groups_->one_host()) return false;
  GroupsCall("allreduce", [&] { groups_->AllreducePieces(pieces, dtype, how, scale); });
  return true;
}

void GlooBackend::DoAllreduce(const void* in, void* out, size_t count, DType dtype, Reduction how) {
  if (groups_) {
    return GroupsCall("allreduce", [&] { groups_->Allreduce(in, out, count, dtype, how); });
  }
  Guard("allreduce", [&] { GlooAllreduce(context_, Among::kMembers, in, out, count, dtype, how); });
}

void GlooBackend::DoAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  if (groups_) return GroupsCall("allgather", [&] { groups_->Allgatherv(in, out, bytes); });
  Guard("allgather", [&] { GlooAllgatherv(context_, in, out, bytes); });
}

void GlooBackend::DoBroadcast(void* data, size_t bytes, int root) {
  if (groups_) return GroupsCall("broadcast", [&] { groups_->Broadcast(data, bytes, root); });
  Guard("broadcast", [&] { GlooBroadcast(context_, data, bytes, root); });
}

// Through the host's shared memory where every rank shares it (each byte written to the
// segment once and read once, instead of through the kernel's loopback and gloo's event loop);
// over the TCP pairs between every two ranks otherwise.
void GlooBackend::DoAlltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                              const std::vector<size_t>& recv_bytes) {
  if (groups_ && groups_->one_host()) {
    return GroupsCall("alltoall", [&] { groups_->Alltoallv(in, send_bytes, out, recv_bytes); });
  }
  Guard("alltoall", [&] { GlooAlltoallv(context_, in, send_bytes, out, recv_bytes); });
}

void GlooBackend::DoBarrier() {
  if (groups_) return GroupsCall("barrier", [&] { groups_->Barrier(); });
  Guard("barrier", [&] { GlooBarrier(context_); });
}

std::unique_ptr<gloo::transport::UnboundBuffer> GlooBackend::Buffer(
    void* data, size_t bytes, std::vector<gloo::transport::UnboundBuffer*>* watched,
    const std::shared_ptr<gloo::Context>& context) {
  auto buffer = context->createUnboundBuffer(data, bytes);
  watched->push_back(buffer.get());
  return buffer;
}

std::unique_ptr<Communicator> CreateGlooBackend(const CollectivesConfig& config,
                                                std::unique_ptr<RendezvousServer> server) {
  return std::make_unique<GlooBackend>(config, std::move(server));
}

}  // namespace dtrain::collectives

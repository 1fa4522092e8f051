// GlooBackend: the Communicator (backend.h) over Gloo that CreateGlooBackend makes. Collectives go
// over the TCP pairs between every two ranks that JoinGloo (gloo_setup.h) connected, or through
// the hosts' shared memory groups (host_groups.h) where every rank has one.
//
// One class; its member functions are defined by family, as Gloo's own algorithms are:
//   gloo_backend.cc             joining, teardown, process sets, and the path each call takes
//   gloo_backend_allreduce.cc   allreduce: a cached halving_doubling (ring_chunked), bcube or ring
//   gloo_backend_allgatherv.cc  allgatherv: around the ring, or small blocks to every peer at once
//   gloo_backend_alltoallv.cc   alltoallv over the pairs
//   gloo_backend_broadcast.cc   broadcast
//   gloo_backend_barrier.cc     barrier
//   gloo_backend_host_groups.cc the shared memory path: setting up the host groups, a call through
//                               them, and gloo among the hosts' leaders (LeaderChannel)
//   gloo_backend_failure.cc     a failed call: closing every connection, naming the rank that left
//
// Timeouts: the rendezvous waits at most DTRAIN_CONNECT_TIMEOUT_MS for the other ranks; every
// collective at most DTRAIN_COLLECTIVE_TIMEOUT_MS (gloo's context timeout). A rank that dies
// closes its sockets, so its peers fail at once; this rank then closes its own connections too,
// so that ranks blocked on *it* fail at once instead of at the timeout, and asks the rendezvous
// host which rank left first to name it.
//
// Threads: as Communicator's, one caller at a time; the watchdog (gloo_watchdog.h) asks who left
// (LostRanksText) on its own thread.
#pragma once

#include <gloo/algorithm.h>
#include <gloo/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/backend.h"
#include "collectives/config.h"
#include "collectives/gloo/gloo_setup.h"
#include "collectives/gloo/gloo_watchdog.h"
#include "collectives/gloo/host_groups.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {

class GlooBackend final : public Communicator, private LeaderChannel {
 public:
  // The whole job: joins the mesh (gloo_setup.h).
  // `server`: rank 0's rendezvous, already open (an elastic job's), or null.
  GlooBackend(const CollectivesConfig& config, std::unique_ptr<RendezvousServer> server);

  // A process set: `members` (ranks of the job, ascending, this one among them) connect a gloo
  // context of their own over the job's rendezvous and devices, under `prefix` in the store.
  GlooBackend(std::shared_ptr<GlooMembership> mesh, std::vector<int> members,
              const std::string& prefix, const CollectivesConfig& config);

  ~GlooBackend() override;

  // config_.rank is this process's rank in the job, in a set's communicator too.
  std::unique_ptr<Communicator> Subset(const std::vector<int>& ranks, int generation) override;

  BackendKind kind() const override { return BackendKind::kGloo; }

 protected:
  // Through the host groups where they are set up, over gloo otherwise (gloo_backend.cc).
  void DoAllreduce(const void* in, void* out, size_t count, DType dtype, Reduction how) override;
  // Every rank on this host: through the shared memory segment, no fusion buffer.
  bool DoAllreducePieces(std::span<const AllreducePiece> pieces, DType dtype, Reduction how,
                         double scale) override;
  void DoAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void DoBroadcast(void* data, size_t bytes, int root) override;
  void DoAlltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override;
  void DoBarrier() override;

 private:
  // gloo_backend.cc
  GlooBackend(std::unique_ptr<GlooMembership> mesh, const CollectivesConfig& config);
  // What both constructors do once `context_` connects this communicator's ranks: the layout of
  // its hosts, the watchdog, the shared memory groups.
  void Start(gloo::rendezvous::Store& store);
  // A gloo buffer over our memory, listed in `watched` for the watchdog to abort its waits.
  static std::unique_ptr<gloo::transport::UnboundBuffer> Buffer(
      void* data, size_t bytes, std::vector<gloo::transport::UnboundBuffer*>* watched,
      const std::shared_ptr<gloo::Context>& context);
  // "rank 1 (host, address)" for this communicator's rank `r`, named by its rank in the job.
  const std::string& Peer(int r) const { return mesh_->peers[members_[r]]; }

  // One gloo call each among `context`'s ranks (this communicator's, or the hosts' leaders'),
  // bounded by the collective timeout and watched by the watchdog. Callers run them in Guard.
  // gloo_backend_allreduce.cc: the algorithm DTRAIN_GLOO_ALGORITHM names, or for "auto" the one
  // measured fastest for the size: a cached class-based one (below) or gloo's option-based bcube
  // or ring. `among` tells which context it is (their cached instances are kept apart).
  enum class Among { kMembers, kLeaders };
  void GlooAllreduce(const std::shared_ptr<gloo::Context>& context, Among among, const void* in,
                     void* out, size_t count, DType dtype, Reduction how);
  // gloo_backend_allgatherv.cc
  void GlooAllgatherv(const std::shared_ptr<gloo::Context>& context, const void* in, void* out,
                      const std::vector<size_t>& bytes);
  void GlooAllgathervDirect(const std::shared_ptr<gloo::Context>& context, const void* in,
                            void* out, const std::vector<size_t>& bytes);
  // gloo_backend_alltoallv.cc
  void GlooAlltoallv(const std::shared_ptr<gloo::Context>& context, const void* in,
                     const std::vector<size_t>& send_bytes, void* out,
                     const std::vector<size_t>& recv_bytes);
  // gloo_backend_broadcast.cc
  void GlooBroadcast(const std::shared_ptr<gloo::Context>& context, void* data, size_t bytes,
                     int root);
  // gloo_backend_barrier.cc
  void GlooBarrier(const std::shared_ptr<gloo::Context>& context);

  // gloo_backend_allreduce.cc: the class-based algorithms (ring_chunked, halving_doubling) among
  // a context's ranks, built per size bucket (gloo_backend_allreduce.cc) and dtype and kept.
  // Keyed by what every rank agrees on (not by the caller's memory, whose address differs between
  // ranks: one rank reusing an instance while another built a new one would pair their slots
  // wrongly and hang both).
  struct Cached {
    std::vector<char> buffer;
    std::unique_ptr<gloo::Algorithm> algorithm;
    bool ran = false;  // its first run may have shrunk the pairs' send buffers (pair_sockets.h)
  };
  Cached& CachedAlgorithm(const std::shared_ptr<gloo::Context>& context, Among among,
                          const std::string& algorithm, size_t count, DType dtype);

  // gloo_backend_host_groups.cc.
  // LeaderChannel (host_groups.h): gloo among the hosts' leaders.
  void LeadersAllreduce(void* data, size_t count, DType dtype, Reduction how) override;
  void LeadersAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void LeadersBroadcast(void* data, size_t bytes, int root_host) override;
  void LeadersBarrier() override;

  // Runs one collective through the host groups. After an error (the group's, naming the rank, or
  // a leader's gloo call, which Guard has recorded) every later call fails the same way, and this
  // rank abandons its host's group so that the ranks there fail at once instead of waiting for it.
  template <typename Call>
  void GroupsCall(const char* what, Call&& call) {
    ThrowIfBroken();
    std::string error;
    bool timed_out = false;
    try {
      call();
      return;
    } catch (const TimeoutError& e) {
      timed_out = true;
      error = e.what();
    } catch (const std::exception& e) {
      error = e.what();
    }
    GroupsFailed(what, error, timed_out);
  }
  [[noreturn]] void GroupsFailed(const char* what, const std::string& error, bool timed_out);

  // Ranks that share a host exchange through their host's shared memory group (host_groups.h).
  // Each host's leader creates its group and always publishes the name ("" when it offers none)
  // so that nobody waits for it in vain; every rank then says through gloo whether it is ready,
  // and the groups are used only if all are (a full /dev/shm, or one rank with DTRAIN_GLOO_SHM=0,
  // leaves every rank on gloo alone).
  void SetUpSharedMemory(gloo::rendezvous::Store& store, const CollectivesConfig& config,
                         const std::vector<std::string>& host_ids);

  // gloo_backend_failure.cc.
  // After a failure every call fails the same way: the ranks no longer agree on what was exchanged.
  void ThrowIfBroken() const;

  // Runs one gloo call; turns gloo's exceptions into ours, naming the rank that left.
  template <typename Call>
  void Guard(const char* what, Call&& call) {
    ThrowIfBroken();
    try {
      call();
    } catch (const std::exception& e) {
      Fail(what, e);
    }
    // An aborted call may return normally, with whatever its buffers held.
    if (watchdog_ && !watchdog_->found().empty())
      Fail(what, "a wait aborted by the watchdog", false);
  }
  [[noreturn]] void Fail(const char* what, const std::exception& gloo_error);
  [[noreturn]] void Fail(const char* what, const std::string& gloo_error, bool timeout);

  // "rank 2 (host) left the job" from the rendezvous host's record of dropped connections.
  // The dead rank's connection to rank 0 drops at the same moment as its gloo pairs: `grace`
  // gives rank 0 a moment to notice. "" when nobody left (or nobody can tell: no TCP rendezvous).
  std::string LostRanksText(Duration grace);

  void CloseConnections();

  std::string algorithm_;
  Duration timeout_;
  CollectivesConfig config_;
  // The rendezvous, the job's pairs, who is who: shared with the process sets' communicators.
  std::shared_ptr<GlooMembership> mesh_;
  std::vector<int> members_;  // this communicator's ranks, as ranks of the job
  int global_rank_ = 0;       // this process's rank in the job
  std::unique_ptr<gloo::rendezvous::PrefixStore> set_store_;  // a process set's part of the store
  std::shared_ptr<gloo::Context> context_;                    // among members_
  std::vector<PairSocket> members_sockets_;  // under context_'s pairs, and leaders_'s
  std::vector<PairSocket> leaders_sockets_;
  std::map<std::tuple<Among, size_t, DType>, Cached> cached_;
  size_t cached_bytes_ = 0;  // buffer bytes of the cached instances
  std::string failure_;
  bool timed_out_ = false;
  std::unique_ptr<GlooWatchdog> watchdog_;  // with a TCP rendezvous only
  std::shared_ptr<gloo::Context> leaders_;  // one rank per host; set on those ranks only
  std::unique_ptr<HostGroups> groups_;      // the collectives' path when set
  std::vector<char> direct_input_;  // GlooAllgathervDirect's: this rank's block once per rank
};

}  // namespace dtrain::collectives

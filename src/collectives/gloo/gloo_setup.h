// Joining the job's gloo mesh: the rendezvous (rank 0's RendezvousServer, a FileStore in a shared
// directory, or nothing for a job of one), every rank's announcement, and the TCP pairs between
// every two ranks. The communicator (gloo_backend.h) runs collectives over what this returns.
#pragma once

#include <gloo/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <memory>
#include <string>
#include <vector>

#include "collectives/config.h"
#include "collectives/gloo/pair_sockets.h"
#include "collectives/gloo/rendezvous_client.h"
#include "collectives/gloo/rendezvous_server.h"

namespace dtrain::collectives {

// Caps every wait of the store it wraps: gloo waits for peers' addresses with its context timeout
// (the collective timeout, minutes), but a rank that never arrives should fail the rendezvous
// within the connect timeout.
class CappedStore : public gloo::rendezvous::Store {
 public:
  CappedStore(gloo::rendezvous::Store& inner, Duration cap) : inner_(inner), cap_(cap) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override { return inner_.get(key); }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, cap_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, std::min<std::chrono::milliseconds>(timeout, cap_));
  }

 private:
  gloo::rendezvous::Store& inner_;
  Duration cap_;
};

// What a rank holds once it has joined. Members are destroyed in reverse order: the pairs before
// the device, and the rendezvous client (which says goodbye) before rank 0's server.
struct GlooMembership {
  std::unique_ptr<RendezvousServer> server;  // rank 0, with a TCP rendezvous
  std::unique_ptr<RendezvousClient> client;  // with a TCP rendezvous: it also knows who left
  std::unique_ptr<gloo::rendezvous::Store> local_store;  // a FileStore or, alone, a HashStore
  std::unique_ptr<gloo::rendezvous::PrefixStore> prefixed;
  std::unique_ptr<CappedStore> store;  // what later exchanges (shared memory, leaders) use
  std::string rendezvous;              // where the rendezvous is, for errors
  std::string address;                 // this rank's gloo address, for errors
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::Context> context;  // every rank
  std::vector<PairSocket> pair_sockets;    // under context's pairs
  std::vector<std::string> peers;          // "rank 1 (host, address)", by rank
  std::vector<std::string> hostnames;      // by rank
  std::vector<std::string> host_ids;       // by rank (common/host_id.h): who may share memory
  int local_rank = 0;                      // as Horovod counts it, by hostname
  int local_size = 1;
};

// Joins the mesh as config.rank of config.size. Throws TimeoutError naming the ranks that did not
// arrive within DTRAIN_CONNECT_TIMEOUT_MS, PeerError when the pairs cannot be connected.
// `server`: rank 0's rendezvous, already listening (an elastic job's rank 0 opened it to tell the
// launcher its port), or null to open it here.
std::unique_ptr<GlooMembership> JoinGloo(const CollectivesConfig& config,
                                         std::unique_ptr<RendezvousServer> server = nullptr);

}  // namespace dtrain::collectives

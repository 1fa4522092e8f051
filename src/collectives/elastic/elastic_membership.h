// A worker's side of an elastic job (launcher/watch/elastic_job.h): before its collectives start
// (Init), the worker asks `dtrain launch` for a place in the next membership over its report
// channel, and waits until every live worker has asked. The launcher answers each with its rank
// and the job's size; rank 0 first, which opens the gloo rendezvous and says on which port, then
// the others, with where to find it. Later, at a commit, a worker asks whether workers came or
// went since its membership formed (dtrain.torch.elastic raises HostsUpdatedInterrupt then).
//
// Every answer from the launcher is bounds-checked: a malformed one is a ProtocolError.
//
// Threads: Init's caller; HostsUpdated from any thread (one request at a time on the link).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "collectives/collectives_internal.h"
#include "collectives/config.h"
#include "collectives/gloo/rendezvous_server.h"

namespace dtrain::collectives {

struct ElasticPlace {
  int generation = 0;
  int rank = -1;
  int size = 0;
  std::string rendezvous_host;
  uint16_t rendezvous_port = 0;
  std::unique_ptr<RendezvousServer> server;  // rank 0's: the gloo rendezvous it opened
};

// Waits (config.elastic_timeout at most) for this worker's place in the next membership. Throws
// RemovedFromJob when the launcher says this worker leaves, TimeoutError, PeerError when the
// launcher cannot be reached, ProtocolError for a malformed answer.
ElasticPlace JoinElasticMembership(const CollectivesConfig& config);

// Steps rolled back to the last commit, sent with the next join (then forgotten). Negative counts
// as 0.
void NoteRolledBackSteps(int64_t steps);

// Whether workers came (kAdded) or only went (kRemoved) since this process's last membership
// formed. Throws PeerError or TimeoutError when the launcher cannot be asked within `timeout`.
HostsUpdate AskLauncherHostsUpdate(Duration timeout);

}  // namespace dtrain::collectives

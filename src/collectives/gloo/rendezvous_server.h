// The gloo rendezvous over TCP, rank 0's half: a small key-value store that rank 0 hosts.
//
// Gloo's ranks find each other by publishing their addresses in a shared store; the Debian gloo
// has no TCP store, so rank 0 runs RendezvousServer on DMLC_PS_ROOT_PORT and every rank (rank 0
// included) talks to it through a RendezvousClient (rendezvous_client.h), which is a
// gloo::rendezvous::Store. The protocol both speak is rendezvous_wire.h.
//
// A rank's connection stays open for the whole job and doubles as a liveness signal: the server
// notes every rank whose connection drops without a goodbye, and (with heartbeats) every rank
// silent for longer than the heartbeat timeout, which a frozen or cut-off process is although its
// sockets stay open; any rank can then ask who is lost (RendezvousClient::LostRanks).
//
// With a job secret (DTRAIN_JOB_SECRET), a client proves it knows the secret before any request
// counts, and rank 0 proves it too (auth/job_auth.h). A client that fails is answered with the
// reason and dropped; it is never counted as a rank, so its end is nobody's loss. A malformed
// request closes that connection; the server keeps serving the others.
//
// Threads: it serves every connection on an io thread of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dtrain/common/deadline.h"

namespace dtrain::collectives {

class RendezvousServer {
 public:
  // Listens at `port` for a job of `size` ranks, on the address `host` names (DMLC_PS_ROOT_URI) if
  // it is one of this machine's, else (or with host "") on every interface; `job_secret`
  // non-empty: clients must authenticate. A connection that has not said hello (and proved the
  // secret) within `hello_timeout` is dropped. Throws PeerError naming the port when it cannot
  // listen.
  // `heartbeat_timeout` > 0: a rank that sends nothing for that long counts as lost.
  RendezvousServer(uint16_t port, int size, std::string job_secret = "",
                   Duration hello_timeout = Duration(10000), const std::string& host = "",
                   Duration heartbeat_timeout = Duration(0));
  ~RendezvousServer();  // stops serving and closes every connection

  // The port it listens on (the one the system chose, for `port` 0).
  uint16_t port() const;

  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::collectives

// The gloo rendezvous over TCP, every rank's half: a gloo::rendezvous::Store whose keys live in
// rank 0's RendezvousServer (rendezvous_server.h), reached over one connection that stays open for
// the whole job. The protocol both speak is rendezvous_wire.h.
//
// The connection doubles as a liveness signal (see rendezvous_server.h): during a collective that
// waits, or after one failed, a rank asks who is lost (LostRanks) and names it in its error. If
// rank 0 itself is gone or frozen, the question fails or goes unanswered, which names rank 0.
//
// With a job secret (DTRAIN_JOB_SECRET) the hello carries the client's nonce, rank 0 answers with
// its nonce and proof, the client sends its proof (which binds its rank): each side proves it
// knows the secret (auth/job_auth.h). A malformed reply is a ProtocolError.
//
// Threads: any; requests take turns on the connection.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/common/deadline.h"

namespace dtrain::collectives {

// A rank the server counts as lost, and why: "left the job (its connection closed)" or "sent
// nothing for 15 s (PS_HEARTBEAT_TIMEOUT): frozen, stopped or cut off".
struct LostRank {
  int rank = -1;
  std::string why;
};

class RendezvousClient : public gloo::rendezvous::Store {
 public:
  // Connects to host:port, retrying until `connect_timeout` passes (rank 0 may start later than
  // us), and says hello as `rank` (authenticating with `job_secret` if non-empty). Throws
  // TimeoutError naming host:port, PeerError if rank 0 refuses us or fails to prove the secret.
  // `heartbeat_interval` > 0: a thread sends a heartbeat that often, until the destructor.
  RendezvousClient(const std::string& host, uint16_t port, int rank, Duration connect_timeout,
                   const std::string& job_secret = "", Duration heartbeat_interval = Duration(0));
  ~RendezvousClient() override;  // says goodbye: a clean exit is not a lost rank

  // gloo::rendezvous::Store. Each call has a deadline (`connect_timeout` for the request itself);
  // wait() throws TimeoutError naming the keys still missing.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // Ranks whose connection to rank 0 dropped without a goodbye or who went silent, in the order
  // they were lost. Throws PeerError when rank 0 cannot be asked (then rank 0 is the one gone).
  std::vector<LostRank> LostRanks(Duration timeout);

  const std::string& endpoint() const { return endpoint_; }  // "host:port"

  struct Impl;

 private:
  void Hello(int rank, const std::string& job_secret);  // mutex_ held
  void SendHeartbeats(Duration interval);               // the heartbeat thread

  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
  Duration request_timeout_;
  int rank_;
  std::mutex mutex_;  // one request at a time on the connection
  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_stop_;
  bool stopping_ = false;  // under heartbeat_mutex_
  std::thread heartbeat_;
};

}  // namespace dtrain::collectives

// The gloo rendezvous over TCP: a small key-value store hosted by rank 0.
//
// Gloo's ranks find each other by publishing their addresses in a shared store; the Debian gloo
// has no TCP store, so rank 0 runs RendezvousServer on DMLC_PS_ROOT_PORT and every rank (rank 0
// included) talks to it through a RendezvousClient, which is a gloo::rendezvous::Store.
//
// The connection stays open for the whole job and doubles as a liveness signal: the server notes
// every rank whose connection drops without a goodbye, and (with heartbeats) every rank silent for
// longer than the heartbeat timeout, which a frozen or cut-off process is although its sockets
// stay open; so during a collective that waits, or after one failed, any rank can ask who is lost
// (LostRanks) and name it in its error. If rank 0 itself is gone or frozen, the question fails or
// goes unanswered, which names rank 0.
//
// With a job secret (DTRAIN_JOB_SECRET), a client proves it knows the secret before any request
// counts, and rank 0 proves it too (auth/job_auth.h): the hello carries the client's nonce, rank
// 0 answers with its nonce and proof, the client sends its proof (which binds its rank). A client
// that fails is answered with the reason and dropped; it is never counted as a rank, so its end is
// nobody's loss.
//
// Wire format, both directions: u32 body length, then the body: u8 type/status and fields, strings
// as u32 length + bytes, all little-endian. Everything read off the socket is bounds-checked: a
// malformed request closes that connection (the server keeps serving the others), a malformed reply
// is a ProtocolError.
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

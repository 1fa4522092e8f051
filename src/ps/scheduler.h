// Scheduler: the one process that sets a job up, keeps watch over it, and ends it.
//
// It waits for DMLC_NUM_SERVER servers and DMLC_NUM_WORKER workers to register, assigns ranks
// (the ranks `dtrain launch` asked for when they are consistent, else arrival order), tells every
// node about every other, starts the job when all are connected, runs barriers for the groups
// workers, servers and all, and watches heartbeats. When every worker has finished it tells all
// nodes to terminate. When a node dies it tells all the others which one (role, rank, host:port)
// and why, and exits non-zero.
//
// With DTRAIN_RESTART_WAIT_MS set (dtrain launch --max-restarts), a lost worker leaves a vacancy
// instead: the job waits that long for a replacement to register with the same rank (or any rank,
// if it asks for none). The replacement learns how many barriers the job has completed (kRejoin),
// gets the node table, and starts once every server has connected to it (kNodeReplaced,
// kReplacedReady); the servers keep its rank's place in every round meanwhile (server.h). With
// DTRAIN_CHECKPOINT_DIR as well, a lost server leaves a vacancy the same way: its replacement
// restores its checkpoint, every worker connects to it, and once it has started the workers are
// told (kReplacementStarted) and repeat the rounds since its checkpoint. A vacancy still open at
// the deadline fails the job, naming the member and why it was lost.
//
// All decisions are made on the thread that calls Run(); transport threads only queue events.
#pragma once

#include <memory>

#include "common/config/config.h"
#include "transport/transport.h"

namespace dtrain::ps {

class Scheduler {
 public:
  Scheduler(const Config& config, std::unique_ptr<transport::Transport> transport);
  ~Scheduler();

  // Binds DMLC_PS_ROOT_PORT (0 picks a free port, for tests) and returns the port.
  uint16_t Listen();
  // Runs the job to its end: 0 when every worker finished, 1 when the job failed (after logging
  // why and telling every node).
  int Run();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dtrain::ps

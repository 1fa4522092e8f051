// Engine: the background thread that runs named collectives in the same order on every rank, as
// Horovod's does.
//
// Threads: Allreduce/Allgather/Broadcast/Barrier may be called from any thread; the Communicator is
// used only by the engine's own thread. The thread works in rounds: a submission starts one at
// once; while collectives wait for a late rank, that rank's rounds come a cycle apart
// (DTRAIN_CYCLE_TIME_MS, default 1 ms) and the ranks that submitted everything wait for it inside
// the round (where the backend's waits sleep); with nothing pending, rounds slow to one per 20 ms
// to leave the CPU to training. Each round the thread
//   1. announces the collectives submitted since the last round and learns everyone else's (one
//      small allgather; negotiation.h), so ranks may submit in different orders;
//   2. runs those that every rank has now submitted, in one agreed order: allreduces of the same
//      dtype and op are packed into one fusion buffer up to DTRAIN_FUSION_THRESHOLD_MB and reduced
//      by one backend call; a lone tensor is reduced in its own memory without a copy;
//   3. on rank 0, warns when a collective has waited for some ranks longer than
//      DTRAIN_STALL_WARNING_S, naming the ranks and the collectives.
//
// Failures: when the backend fails (a rank died), every pending and later collective fails with
// that error (PeerError naming the rank when known). Ranks that submit one name with different
// dtypes, shapes, ops or roots all get an InvalidArgument describing each rank's version. A
// handle's Wait throws TimeoutError once DTRAIN_COLLECTIVE_TIMEOUT_MS have passed since submission.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/backend.h"
#include "collectives/collectives_internal.h"
#include "collectives/config.h"
#include "dtrain/collectives/collectives.h"

namespace dtrain::collectives {

struct Handle::State {
  State(std::string what, Duration timeout)
      : what(std::move(what)), timeout(timeout), deadline(Clock::now() + timeout) {}

  // Marks the collective done (with `error` if it failed) and wakes the waiters. Only the first
  // call counts (a handle the engine failed early stays failed); returns whether it was it.
  bool Complete(std::exception_ptr error = nullptr, Array result = {});

  const std::string what;  // "allreduce 'grad.fc1'"
  const Duration timeout;
  const Clock::time_point deadline;

  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
  Array result;
  std::string waiting_for;             // "ranks 1, 3" while some ranks have not submitted it
  std::vector<int64_t> received_rows;  // alltoall: the rows that came from each rank
  std::function<void(std::exception_ptr)> on_done;  // Handle::OnDone, run once by Complete
  // The engine's count of threads in Handle::Wait on its collectives (its deadlock vote);
  // null for handles no engine counts (a join's).
  std::shared_ptr<std::atomic<int>> waiters;
  // How long Wait polls before it sleeps (Engine::Impl::spin_wait); zero: it sleeps at once.
  std::chrono::microseconds spin{0};
  // While polling, Wait runs the engine's due round with this (Engine::Impl::HelpWithRound):
  // true if it ran one.
  std::function<bool()> help_round;
};

// How long a caller waiting for one of `backend`'s collectives polls before it sleeps:
// config.spin_wait where the host has a core for each of the backend's ranks there, else none
// (engine.cc says why). The world's answer is the process sets' too (collectives.cc): a set's
// ranks on a host may be fewer than the host's ranks.
std::chrono::microseconds SpinWaitFor(const CollectivesConfig& config, const Communicator& backend);

class Engine {
 public:
  // Starts the background thread. The engine uses `backend` exclusively until Shutdown returns.
  Engine(std::shared_ptr<Communicator> backend, const CollectivesConfig& config);
  ~Engine();  // Shutdown()

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // See collectives.h. Throw InvalidArgument for a bad argument or a name already in flight; a
  // failure after submission is reported by the handle.
  Handle Allreduce(const std::string& name, const Array& in, const Array& out, ReduceOp op,
                   int priority = 0);
  Handle Allgather(const std::string& name, const Array& in);
  Handle Broadcast(const std::string& name, const Array& inout, int root);
  // Sends splits[r] rows of `in` (in order) to rank r, and receives every rank's rows for this one
  // (result(): concatenated in rank order; Handle::received_rows()).
  Handle Alltoall(const std::string& name, const Array& in, const std::vector<int64_t>& splits);
  // `in` reduced over ranks by `op`; result() is this rank's rows of it (ReducescatterRows).
  Handle Reducescatter(const std::string& name, const Array& in, ReduceOp op);
  // Completes once every rank has called Barrier as often (barriers are numbered per process).
  Handle Barrier();
  // Horovod's join: this rank has no more data. Until every rank has joined, it takes part in
  // the others' allreduces with zeros (other collectives fail with an InvalidArgument while a
  // rank has joined). Completes once every rank has joined; result() is then a float32 scalar
  // holding the rank that joined last. InvalidArgument if this rank's last Join is still pending.
  Handle Join();
  // A front end refused this rank's second collective of `name` itself (its caller had not yet
  // waited for the first, which may have finished already): the refusal goes to the other ranks
  // as Submit's own refusals do, after this rank's collective of that name if one is in flight,
  // so that their second collective of the name fails too and the ranks stay in step.
  void Refuse(const std::string& name);

  // While holds last, submissions wait to be announced: the engine starts no round for them, so
  // that they all join one (SubmittedTogether, collectives.h). Each HoldRounds needs one
  // ReleaseRounds; the last queues what was held.
  void HoldRounds();
  void ReleaseRounds();

  // Collective: stops once every rank has called Shutdown, or once DTRAIN_COLLECTIVE_TIMEOUT_MS
  // has passed (then the other ranks see this rank leave). Collectives that not every rank
  // submitted fail. Idempotent.
  void Shutdown();

  EngineStats stats() const;
  // Whether CUDA arrays go over NCCL (CollectivesConfig::nccl).
  bool nccl_enabled() const;
  Communicator& backend() { return *backend_; }

  struct Impl;

 private:
  std::shared_ptr<Communicator> backend_;
  std::shared_ptr<Impl> impl_;  // shared with the thread, which may outlive a timed-out Shutdown
  std::mutex shutdown_mutex_;   // one Shutdown at a time joins the thread
  std::thread thread_;
};

}  // namespace dtrain::collectives

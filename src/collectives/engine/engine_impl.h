// Engine::Impl, shared by the engine's files: engine.cc (submission, the negotiation rounds,
// failures, shutdown), run_collectives.cc (what each agreed collective does with the backend) and
// waiting.cc (stall warnings and the deadlock vote).
// Internal to src/collectives/engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/engine/autotune.h"
#include "collectives/engine/engine.h"
#include "collectives/engine/failure.h"
#include "collectives/engine/fusion_plan.h"
#include "collectives/engine/negotiation.h"
#include "collectives/nccl/device_communicator.h"

namespace dtrain::collectives {

// One submitted collective, from Submit until it finishes.
struct Request {
  std::string name;
  Descriptor desc;
  Array in;
  Array out;
  std::shared_ptr<Handle::State> state;
};

struct Engine::Impl : std::enable_shared_from_this<Engine::Impl> {
  Impl(std::shared_ptr<Communicator> b, const CollectivesConfig& c)
      : backend(std::move(b)),
        config(c),
        rank(backend->rank()),
        size(backend->size()),
        tuned{c.fusion_threshold_bytes, c.cycle_time},
        spin_wait(SpinWaitFor(c, *backend)),
        table(size) {
    if (c.autotune && rank == 0) {
      autotuner = std::make_unique<Autotuner>(
          tuned,
          AutotuneOptions{c.autotune_warmup_samples, c.autotune_steps_per_sample, c.autotune_log});
    }
  }

  Handle Submit(Request request);
  // The background thread's loop (rounds.cc): a round whenever one is due (RoundDue), until the
  // ranks have shut down or the engine failed, then fails what is left.
  void Run();
  // Any thread, holding round_mutex: one round. False once the engine is over (`stopped`).
  bool RunRound();
  // A waiting caller's turn (Handle::Wait): runs the round that is due, if no other thread is
  // running one and no CUDA collective was ever submitted (NCCL stays on the engine thread).
  // Returns whether it ran one.
  bool HelpWithRound();
  bool RoundDue() const;  // under `mutex`
  // Under `mutex`: moves what holds kept back (SubmittedTogether) into the queue, waking the
  // thread if it was idle.
  void ReleaseHeld();
  // Under `mutex`: every request submitted and not yet announced, queued or held back.
  std::vector<Request> TakeUnannounced();

  // --- the thread running a round (round_mutex) only ---
  std::vector<RoundMessage> Exchange(const RoundMessage& mine);
  void Execute(std::vector<ReadyCollective>& ready);
  // Runs one fusion batch of `runnable`: the allreduce of highest priority and those after it, in
  // order of priority, that fit in the same buffer; the rest wait for the next round, where
  // allreduces that have become ready since may overtake them.
  void RunFirstBatch();
  void ReduceBatch(const std::vector<Request*>& batch, const FusionGroup& group);
  // Completes this rank's pending Join, if any: with the last rank to join, or with `error`.
  void CompleteJoin(std::exception_ptr error, int last_rank = -1);
  void RunAllgather(Request& r, const ReadyCollective& c);
  void RunBroadcast(Request& r);
  void RunAlltoall(Request& r, const ReadyCollective& c);
  void RunReducescatter(Request& r);
  // What this rank reduces for an allreduce it has joined: the identity of the op (zeros for
  // sums), in the memory the others' tensors are in.
  Array StandIn(const Descriptor& d);
  // This rank's NCCL communicator, made by the first collective on CUDA arrays (every rank gets
  // there at the same point of the agreed order).
  DeviceCommunicator& Nccl();
  void Monitor(Clock::time_point now);
  // This round's deadlock vote (RoundMessage::stuck), and what the ranks' votes decide.
  bool StuckVote(Clock::time_point now) const;
  void FailDeadlock(const std::vector<RoundMessage>& round, Clock::time_point now);
  // A rank that shuts its collectives down submits nothing more: what it has not submitted (and
  // a join it has not made) fails now, naming it, rather than at the collective deadline.
  void FailWhatShutDownRanksMiss(const std::vector<RoundMessage>& round);
  void Finish(Request& r, std::exception_ptr error = nullptr, Array result = {});
  void FailAll(const Failure& failure);
  // Any thread: the backend learnt that a rank left while the engine thread may be stuck in a
  // call waiting for it. Fails every handle now; the thread finishes the job when it returns.
  void Abandon(const Failure& failure);

  const std::shared_ptr<Communicator> backend;
  const CollectivesConfig config;
  const int rank;
  const int size;
  // The fusion threshold and cycle time in effect: the configured ones, or autotune's as rank 0
  // announced them (every rank switches in the same round).
  TunedParameters tuned;
  std::unique_ptr<Autotuner> autotuner;           // rank 0 under HOROVOD_AUTOTUNE
  std::optional<TunedParameters> announce_tuned;  // for rank 0's next round message
  const std::chrono::microseconds spin_wait;      // SpinWaitFor: each handle's State::spin

  // Held by whichever thread runs a round (the engine's, or a waiting caller's): it guards the
  // members from `table` on, which only rounds touch.
  std::mutex round_mutex;
  std::mutex mutex;                             // guards the members up to `finished`
  Clock::time_point next_cycle = Clock::now();  // when the next round is due at the latest
  bool stopped = false;                         // no more rounds: Run cleans up and returns
  std::condition_variable wake;
  std::deque<Request> queue;  // submitted, not yet announced
  int holds = 0;              // SubmittedTogether objects alive (Engine::HoldRounds)
  std::deque<Request> held;   // submitted while holds > 0: queued when the last one ends
  // Submitted, not yet finished: the names, and the handles for failing them from any thread.
  std::unordered_map<std::string, std::shared_ptr<Handle::State>> in_flight;
  // Refusals of names submitted again while in flight (OpKind::kRefused), by name, each waiting
  // for the collective before it to finish.
  std::unordered_map<std::string, std::deque<Request>> refused;
  std::optional<Failure> failure;
  bool shutdown_requested = false;
  Clock::time_point shutdown_deadline;
  bool finished = false;
  std::condition_variable finished_cv;
  uint64_t barriers = 0;
  std::shared_ptr<Handle::State> join;  // this rank's Join, until every rank has joined
  // The GPU of this rank's CUDA collectives: the first one's (NCCL takes one GPU per rank).
  int nccl_device = -1;
  bool announce_join = false;  // Join called; goes into the next round's message

  std::atomic<bool> device_seen{false};  // a CUDA collective was submitted (HelpWithRound)

  NegotiationTable table;
  std::vector<int> not_shutting_down;                // the ranks whose last round message was not
                                                     // shutting down
  std::unordered_map<std::string, Request> pending;  // announced, not yet run
  // Allreduces every rank has submitted (or joined), not yet run: the same list on every rank.
  std::vector<ReadyCollective> runnable;
  std::vector<char> fusion;
  std::unique_ptr<DeviceCommunicator> nccl;
  std::atomic<bool> nccl_abort{false};  // set by Abandon: NCCL's waits end at once
  std::vector<char> send_slot, recv_slots, overflow;
  Clock::time_point last_describe{};
  // Threads in Handle::Wait on this engine's collectives (Handle::State::waiters).
  const std::shared_ptr<std::atomic<int>> waiters = std::make_shared<std::atomic<int>>(0);
  // When some rank last submitted something or a collective last ran: the deadlock vote's clock.
  Clock::time_point last_progress = Clock::now();
  Clock::time_point last_stall_check = Clock::now();

  std::atomic<uint64_t> rounds{0}, data_calls{0}, collectives{0}, fused_tensors{0},
      caller_rounds{0};
};

}  // namespace dtrain::collectives

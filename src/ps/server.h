// Server: holds the values of the slots placed on it and applies what workers push.
//
// dist_sync (per slot): a round completes when every worker has pushed once; the merged sum is
// then applied (handed to the optimizer if one is set, else stored as the new value) and only then
// are the round's pushes acknowledged and its pulls answered. A worker that pushes again before the
// round completes has that push (and whatever it sends after, in order) held for the next round.
// Compressed pushes (compression/codec.h) are checked against the slot (length, float32, well
// formed words) and decoded into float32 as they are summed; replies are never compressed.
// dist_async: each push is applied on arrival under the slot's lock (with the optimizer, or added
// to the value when there is none, so the value is the total of all pushes), and counted per
// worker rank: the counts play the part of rounds for restarts (below).
//
// A lost worker's replacement (DTRAIN_RESTART_WAIT_MS): the rounds its rank had pushed into when
// it was lost are completed, not rolled back. What the lost process pushed stays in its round;
// the requests it left waiting (and pushes it had queued for later rounds) are dropped when the
// replacement comes (OnWorkerReplaced). The replacement asks each server how many rounds its rank
// has contributed to its slots ("rejoin_state"; it resumes at the fewest among the slots pushed
// most, see DistKVStore::Rejoin) and then says where it resumes ("rejoin"): a slot where the lost
// process had already pushed for that round absorbs the replacement's push of it (answered with the
// round's result, never summed again), so no gradient counts twice and none is missing. A server
// checkpoints as soon as it loses a worker (with DTRAIN_CHECKPOINT_DIR), so that the lost process's
// pushes outlive this server too. When they did not (this server was lost and restored a
// checkpoint from before them, and the worker was lost before it repeated them), the slot's rounds
// from its checkpoint to where the replacement resumes complete without that rank's push, as
// far as the other workers pushed them (logged, once per slot): its gradient of those rounds is
// gone with both processes.
//
// Checkpoints (DTRAIN_CHECKPOINT_DIR, checkpoint_file.h): when the server joins, after every
// change of what it holds (an init, an optimizer or its state: acknowledged only once a checkpoint
// holds them, so a restore never lacks a slot), every DTRAIN_SERVER_CHECKPOINT_S while pushes come,
// when a worker asks ("checkpoint_now": its replay log is half full) and at the end, the server
// pauses every slot at once (each at a whole round), takes its values (shared, copy on write) and
// the optimizer's state, and writes them on a thread of its own; then it tells every worker each
// slot's rounds ("checkpointed"), and the workers drop what they kept of those rounds. A
// replacement for a lost server (the scheduler says so: Node::rejoined) restores its rank's
// checkpoint before it answers anyone, and says where each slot resumes
// ("restored_rounds"); each worker then repeats its pushes of the rounds since, in order, so the
// values become exactly what they would have been (dist_sync). A dist_async slot's checkpoint
// holds each worker's count of pushes applied, and each worker repeats its pushes since its own
// count: none is lost or applied twice, though they apply in another order than the first time.
//
// Values are never copied to answer a pull: the reply shares the stored buffer, and an update that
// finds the buffer still being sent writes into a fresh one (copy on write).
//
// Threads: Handle is called on transport threads. It queues data requests on a RequestScheduler
// (request_scheduler.h), whose DTRAIN_APPLY_THREADS threads apply them (one slot's in order, the
// most urgent slot first), and handles control requests itself once the data requests before them
// ran.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "common/config/config.h"
#include "optim/optimizer.h"
#include "ps/checkpoint_file.h"
#include "ps/node/node.h"
#include "ps/request_scheduler.h"
#include "ps/thread_pool.h"
#include "transport/message.h"

namespace dtrain::ps {

class Server {
 public:
  Server(Node& node, const Config& config);
  ~Server();

  void Handle(transport::Message&& msg);
  // The most bytes a request's body may carry (Node::SetBodyLimit): a push or pushpull to an
  // initialised slot carries exactly its value (or its compressed form); one to a slot never
  // initialised, or a pull, carries nothing worth storing; init and commands are bounded only by
  // DTRAIN_MAX_MESSAGE_BYTES. Thread-safe.
  size_t BodyLimit(const transport::Header& h);
  // A worker left the job: dist_sync rounds can no longer complete; fail them instead of waiting.
  void OnWorkerFinished(int worker_rank);
  // A lost worker's replacement is about to connect: drop what the lost process left waiting.
  void OnWorkerReplaced(int worker_rank);
  // A worker was lost and the job waits for its replacement: checkpoint what it pushed.
  void OnWorkerLost(int worker_rank);
  // The node knows its rank (before it answers anyone). With DTRAIN_CHECKPOINT_DIR: a replacement
  // restores its rank's checkpoint (throws Error if there is none or it is corrupt), an original
  // member removes what an earlier job left there; then checkpoints start.
  void OnJoined();
  // At the job's end: the last checkpoint, written before returning. Logs, never throws.
  void FinalCheckpoint();

 private:
  struct SlotState;

  // Everything but data requests, on the transport's thread.
  void HandleControl(transport::Message&& msg);
  void HandleInit(transport::Message&& msg);
  void HandleSetOptimizer(const transport::Message& msg);
  // {"cmd": "get_optimizer_state"} / {"cmd": "set_optimizer_state", "bytes": n} with the bytes
  // as body: the optimizer's state, to save with a model and restore on resume;
  // {"cmd": "set_learning_rate", "learning_rate": r, "from_update": t}: a rate change between two
  // steps (KVStore::SetLearningRate).
  void HandleCommand(const transport::Message& msg);
  // {"cmd": "rejoin_state"}: {"counts": the distinct numbers of rounds the sender's rank has
  // pushed into the sync slots here, "slots": n, "pushed": [[key, part, rounds]...]}; {"cmd":
  // "rejoin", "round": r}: the sender resumes at round r.
  void HandleRejoinCommand(const transport::Message& msg, const std::string& cmd, int64_t round);
  // Whether a data request costs less than handing it to the scheduler's threads: small bodies,
  // and pushes that only replace the value.
  bool Cheap(const transport::Message& msg) const;
  // On the scheduler's threads: HandleData, answering an exception with an error reply.
  void RunDataRequest(transport::Message&& msg);
  void HandleData(transport::Message&& msg);
  // {"cmd": "restored_rounds"}: each slot's rounds in the restored checkpoint (a replacement);
  // {"cmd": "checkpoint_now", "after": n}: a checkpoint soon (the asker's replay log fills up),
  // unless one after its number n (the last the asker heard of) is already taken: every worker's
  // log fills at the same pace, and one checkpoint answers them all.
  // `meta`: the command's parsed meta (HandleCommand checked it is an object).
  void HandleCheckpointCommand(const transport::Header& h, const nlohmann::json& meta,
                               const std::string& cmd);
  // Checkpoints (server_checkpointing.cc).
  void CheckpointLoop();
  void RequestCheckpoint();
  // Ends CheckpointLoop (no more periodic or requested checkpoints) and joins its thread.
  void StopCheckpoints();
  // Answers `request` (an init, an optimizer) once a checkpoint holds its change; at once without
  // checkpoints.
  void AcknowledgeOnceCheckpointed(const transport::Header& request);
  // Every slot paused at once: values, rounds and the optimizer's state.
  ServerCheckpoint Capture();
  // Captures, writes and (announce) tells the workers each slot's rounds; logs a failure.
  void WriteAndAnnounce(bool announce);
  void Restore(const ServerCheckpoint& checkpoint);
  void InstallOptimizer(const std::string& spec_json);
  // Sync mode, slot lock held.
  void SyncMessage(SlotState& slot, int worker, transport::Message&& msg);
  void Accumulate(SlotState& slot, int worker, transport::Message&& msg);
  void CompleteRound(SlotState& slot);
  void DrainDeferred(SlotState& slot);
  // A replacement's first push into a slot that lacks rounds of its rank (server.h): how many of
  // those rounds complete without it.
  void DecideLostRounds(SlotState& slot, int worker);
  // Marks the current round pushed for every rank with rounds to skip.
  void SkipLostRounds(SlotState& slot);
  void FailRound(SlotState& slot, const std::string& why);
  std::string FinishedWorkerProblem();
  // Async mode, slot lock held.
  void AsyncMessage(SlotState& slot, int worker, transport::Message&& msg);
  // With an optimizer: weight update; without: the gradient is added to the value (async).
  void ApplyGradient(SlotState& slot, const transport::Body& grad, Optimizer* optimizer);
  // Why a push or pull of a whole slot's value cannot be served ("" when it can): the body was
  // refused, or does not fit the slot (its type and size, or its compressed words).
  std::string DenseRequestProblem(const SlotState& slot, const transport::Message& msg);
  // Row-sparse requests (server_rows.cc), slot lock held unless said otherwise.
  // BodyLimit of a row push or pull (none for a slot without rows). Takes the slots' lock.
  size_t RowsBodyLimit(const transport::Header& h);
  // Why a row request cannot be served ("" when it can): the slot has no rows, the types differ,
  // the body was refused or does not decode.
  std::string RowRequestProblem(const SlotState& slot, const transport::Message& msg);
  // dist_sync: a row push's rows added to the round's sum (row_sums, or the dense `merged`).
  void AccumulateRows(SlotState& slot, const transport::Message& msg);
  // A dense push joins a round of row pushes: their sum becomes the dense `merged`.
  void DenseRound(SlotState& slot);
  // The round's rows applied: lazily (UpdateRows), densely, or as the new value without an
  // optimizer; row_sums cleared.
  void ApplyRowRound(SlotState& slot);
  // row_sums back to zeros, no row touched, no row round.
  void ClearRowSums(SlotState& slot);
  // dist_async: a row push applied at once, its repeated rows summed.
  void ApplyPushedRows(SlotState& slot, const transport::Message& msg);
  void ReplyRows(SlotState& slot, const transport::Header& request,
                 const std::vector<int64_t>& rows);
  // The value, writable: a fresh copy when a reply still holds the buffer.
  void CopyOnWrite(SlotState& slot);
  std::shared_ptr<Optimizer> CurrentOptimizer();

  void Reply(const transport::Header& request, transport::Body body = {}, std::string meta = {});
  void ReplyError(const transport::Header& request, const std::string& error);
  void ReplyValue(SlotState& slot, const transport::Header& request);
  void Add(char* dst, const char* src, int64_t n, DType dtype);
  // fn(begin, end) over [0, n): split over the reduction threads for a big slot (2^18 elements and
  // more), else fn(0, n) on this thread. Sums and optimizer updates of slots go through it.
  void ForSlotElements(int64_t n, const std::function<void(int64_t, int64_t)>& fn);
  // A compressed push's values into dst (or added to it), on several threads for big slots.
  void Decompress(const transport::Header& h, const transport::Body& packed, char* dst, int64_t n,
                  bool accumulate);

  Node& node_;
  const Config config_;
  ThreadPool reduction_pool_;
  std::shared_mutex slots_mutex_;
  std::map<std::pair<uint64_t, uint32_t>, std::unique_ptr<SlotState>> slots_;
  std::mutex optimizer_mutex_;
  std::shared_ptr<Optimizer> optimizer_;
  std::atomic<bool> optimizer_set_{false};  // optimizer_ is set: pushes cost an update
  // Updates hold it shared; saving or loading the optimizer's state holds it exclusively.
  std::shared_mutex optimizer_state_mutex_;
  std::mutex finished_mutex_;
  std::vector<int> finished_workers_;
  std::atomic<bool> any_worker_finished_{false};  // lets sync pushes skip the mutex
  // Traffic of the values (bodies), for the launcher's status page (report/reporter.h).
  std::atomic<int64_t> bytes_in_{0};
  std::atomic<int64_t> bytes_out_{0};
  int report_id_ = 0;
  // Workers whose lost rounds (DecideLostRounds) the launcher was told of since their last
  // replacement: once per replacement, not once per slot.
  std::mutex lost_rounds_mutex_;
  std::set<int> lost_rounds_reported_;

  // Checkpoints; checkpoint_mutex_ guards the flags and serialises writes.
  std::string checkpoint_folder_;  // "" without DTRAIN_CHECKPOINT_DIR
  std::string optimizer_spec_;     // guarded by optimizer_mutex_
  std::mutex checkpoint_mutex_;
  std::mutex checkpoint_write_mutex_;
  std::condition_variable checkpoint_cv_;
  bool checkpoint_requested_ = false;
  bool checkpoint_stop_ = false;
  std::atomic<bool> pushed_since_checkpoint_{false};
  uint64_t checkpoints_taken_ = 0;  // guarded by checkpoint_mutex_: captured, and written or being
  std::vector<transport::Header> acknowledge_after_checkpoint_;  // guarded by checkpoint_mutex_
  // A replacement's, from its checkpoint (values dropped): what each worker had pushed into them.
  std::vector<CheckpointSlot> restored_slots_;
  std::thread checkpoint_thread_;
  // The longest a network thread waits for room in the scheduler, or a control request for the
  // data requests before it; both end as soon as the scheduler's threads catch up. A third of
  // PS_HEARTBEAT_TIMEOUT: the scheduler's heartbeats are read on the same threads.
  const Duration scheduler_wait_;
  // Last: destroyed first, so no data request runs while the members above go.
  RequestScheduler scheduler_;
};

}  // namespace dtrain::ps

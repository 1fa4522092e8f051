// DistKVStore: the worker's side of dist_sync / dist_async (and their *_device spellings).
//
// Each key is placed by KeyPartition into slots on the servers; a push sends each slot's range of
// the (locally summed) value to its server, a pull asks each server for its ranges and has them
// written straight into the caller's array. Nothing is copied on the way out: the message bodies
// point into the caller's arrays (or into the buffer holding the sum of several devices), which
// the operation keeps alive.
//
// Threads: every method may be called from any thread; operations on one key keep their order.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config/config.h"
#include "compression/codec.h"
#include "dtrain/kvstore/kvstore.h"
#include "kvstore/slab_arena.h"
#include "kvstore/staged_calls.h"
#include "ps/key_partition.h"
#include "ps/node/node.h"
#include "ps/worker_client.h"
#include "transport/transport.h"

namespace dtrain {

class DistKVStore : public KVStore, public StagedCalls {
 public:
  // Joins the job described by `config` as a worker (blocks until the job has started).
  DistKVStore(std::string type, const Config& config,
              std::unique_ptr<transport::Transport> transport, bool exit_on_failure);
  // Waits for outstanding operations, tells the scheduler this worker is done, waits for the job to
  // end (bounded) and disconnects. Never throws; problems are logged.
  ~DistKVStore() override;

  std::string type() const override { return type_; }
  int rank() const override;
  int num_workers() const override;
  int64_t rounds_done() const override { return rounds_done_; }
  bool rejoined() const override { return node_.rejoined(); }

  using KVStore::Init;
  using KVStore::Pull;
  using KVStore::Push;
  using KVStore::PushPull;
  void Init(Key key, const Array& value) override;
  void Init(std::span<const Key> keys, std::span<const Array> values) override;
  Operation Push(Key key, std::vector<Array> values, int priority = 0) override;
  Operation Pull(Key key, std::vector<Array> outs, int priority = 0) override;
  Operation PushPull(Key key, std::vector<Array> values, std::vector<Array> outs,
                     int priority = 0) override;
  Operation IssueStaged(StagedCall call) override;
  // One request per slot of the key's rows (dist_kvstore_rows.cc); a push goes to every slot,
  // empty where it has no row, as each slot's round needs every worker's push.
  Operation PushRows(Key key, std::vector<int64_t> rows, const Array& values,
                     int priority = 0) override;
  Operation PullRows(Key key, std::vector<int64_t> rows, const Array& out,
                     int priority = 0) override;
  void WaitAll() override;
  void Barrier() override;
  void SetOptimizer(const OptimizerSpec& spec) override;
  void SetGradientCompression(const std::map<std::string, std::string>& params) override;
  CompressionSpec gradient_compression() const override;
  std::string SaveOptimizerState() override;
  void LoadOptimizerState(const std::string& state) override;
  void SetLearningRate(double learning_rate, uint64_t from_update) override;

 private:
  struct Residual {
    std::mutex mutex;
    std::vector<float> values;
  };
  struct KeyInfo {
    Shape shape;
    DType dtype;
    std::vector<ps::Slot> slots;
    std::string servers;       // " on server 0 (host:port)": where its operations wait, for errors
    int64_t row_elements = 0;  // a matrix's (2+ dimensions) elements per row; 0 otherwise
    // Gradient compression's error feedback: what this worker has not sent yet, per element
    // (allocated by the first compressed push); its mutex orders compressions of the key. Pushes
    // compressed by the caller (StagedCall::packed: values on a GPU) keep theirs where they
    // compressed.
    std::shared_ptr<Residual> residual;
  };

  const KeyInfo& Lookup(Key key, const char* op) const;
  // The key's info for a row push or pull: a matrix, `rows` within it, `values` (n rows of its
  // row shape, on the host). Throws InvalidArgument naming what does not fit.
  const KeyInfo& LookupRows(Key key, const char* op, const std::vector<int64_t>& rows,
                            const Array& values) const;
  void Check(Key key, const KeyInfo& info, const std::vector<Array>& arrays, const char* op,
             const char* what) const;
  // A buffer of `bytes` for a value of `info`'s key this worker pushes (log_buffers_ or the
  // BufferPool).
  transport::Body NewPushBody(const KeyInfo& info, size_t bytes) const;
  // A copy of `b` in a buffer of this worker's own (NewPushBody).
  transport::Body OwnCopy(const KeyInfo& info, const transport::Body& b) const;
  // The same for the push log, with stores that bypass the caches: the copy is read again only by
  // the send (and by a replay, if a server is restored), and 64 rounds of it would otherwise
  // sweep the training step's working set out of the caches. Adds to log_copied_bytes_ and
  // log_copy_ns_.
  transport::Body LogCopy(const KeyInfo& info, const transport::Body& b);
  // The sum of the device values, as a message body source (no copy for a single value).
  transport::Body Summed(const KeyInfo& info, const std::vector<Array>& values) const;
  // The compression a push of `info`'s key applies (none where the spec does not apply to its
  // size), marking that a push was made (compression is fixed from then on). mutex_ held. Throws
  // InvalidArgument, naming `op`, for compression of a key that is not float32.
  CompressionSpec PushCompression(Key key, const KeyInfo& info, const char* op);
  // A row push's body for `local` (a slot's rows, numbered from its row `first`) whose float32
  // `values` are compressed with `spec` (their residuals updated); sets the header's fields.
  transport::Body CompressedRows(const KeyInfo& info, const CompressionSpec& spec,
                                 const std::vector<int64_t>& local, int64_t first,
                                 const char* values, transport::Header* header);
  // `source` (the key's float32 values) compressed as a whole, residual updated.
  transport::Body Compressed(const KeyInfo& info, const transport::Body& source,
                             const CompressionSpec& spec) const;
  // Sends `command` for `call.key` to the servers of its slots (staged_calls.h; Push, Pull and
  // PushPull leave the staging hooks null).
  Operation Issue(transport::Command command, const StagedCall& call);
  std::shared_ptr<OperationState> Track(std::string what, int parts);
  std::string ServersOf(const std::vector<ps::Slot>& slots) const;
  // A replacement for a lost worker: asks the servers where its rank is and tells them where it
  // resumes (server.h).
  void Rejoin();
  // The server's "rejoin" command: this rank resumes at rounds_done_ (Rejoin, OnServerRestarted).
  transport::Message ResumeRequest() const;
  // A lost server's replacement has started: asks it which rounds it restored and has the client
  // send it what it lacks (worker_client.h). On its own thread; fails the client if it cannot.
  void OnServerRestarted(int server);
  // Sends the server command `command` (JSON, server.h) to every server and waits for every
  // answer; read(server, answer) takes each on a transport thread and throws PeerError when it
  // is malformed (the call then fails with it).
  void AskEveryServer(const std::string& what, const nlohmann::json& command,
                      std::function<void(int, const transport::Message&)> read);
  // Sends one request per slot to the servers and waits for all replies (Init, SetOptimizer).
  void RequestAndWait(const std::string& what,
                      std::vector<std::pair<int, transport::Message>> requests);

  const std::string type_;
  const bool sync_;
  // Pushes are kept for a restored server (replaceable servers, dist_sync or dist_async): their
  // bodies must be this worker's copies, never the caller's arrays.
  const bool log_pushes_;
  // Where pushed values are copied to when log_pushes_, by the server of the key's first slot:
  // the log keeps them long, outside malloc's heap (kvstore/slab_arena.h). One per server, because
  // each server's checkpoints trim its pushes: a slab shared with a server that checkpoints less
  // often would stay mapped until that one's. Empty otherwise (the process's BufferPool).
  const std::vector<std::shared_ptr<SlabArena>> log_buffers_;
  // What keeping pushes cost the callers' threads: bytes copied into the log and the time the
  // copies took (reported to the launcher when the store closes: the job's summary shows them).
  std::atomic<uint64_t> log_copied_bytes_{0};
  std::atomic<uint64_t> log_copy_ns_{0};
  // The log's first fill, faulted in while this worker joined (a start-up cost, off its steps).
  size_t log_reserved_bytes_ = 0;
  double log_reserve_ms_ = 0;
  const Config config_;
  const std::chrono::microseconds wait_spin_;  // WorkerWaitSpin (dist_kvstore.cc)
  ps::Node node_;
  ps::WorkerClient client_;

  // A replacement: the servers were told where its rank resumes (Rejoin's "rejoin"), so a
  // server restored later must be told again (OnServerRestarted). Set once rounds_done_ is final.
  std::atomic<bool> resume_told_{false};
  int64_t rounds_done_ = 0;
  // A replacement: how many of the job's setup barriers (Init's, SetOptimizer's, in the order the
  // program calls them) the job completed before it joined. Those steps only record here (the
  // servers have the keys, the optimizer and its state); the first one not completed is done
  // in full, with the others waiting at its barrier (TakeSetupDoneByTheJob).
  uint64_t setup_barriers_done_by_the_job_ = 0;
  bool TakeSetupDoneByTheJob();

  mutable std::mutex mutex_;
  ps::KeyPartition partition_;
  std::unordered_map<Key, KeyInfo> keys_;
  std::vector<std::shared_ptr<OperationState>> outstanding_;
  CompressionSpec compression_;  // guarded by mutex_
  // SetOptimizer's spec, guarded by mutex_: SetLearningRate checks a change with it.
  std::optional<OptimizerSpec> optimizer_spec_;
  bool pushed_ = false;  // guarded by mutex_: compression is fixed from the first push
};

}  // namespace dtrain

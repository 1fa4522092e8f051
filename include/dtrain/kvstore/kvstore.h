// KVStore: the MXNet key-value store API in C++.
//
//   auto kv = dtrain::KVStore::Create("dist_sync");
//   kv->Init(3, weight);                 // every worker, same keys, same order
//   kv->Push(3, {grad_dev0, grad_dev1});  // values from several devices are summed first
//   kv->Pull(3, {weight}).Wait();
//
// Types (the names Create accepts): "local" and "device" aggregate inside this process;
// "dist_sync", "dist_async", "dist_sync_device" and "dist_async_device" talk to the job's servers,
// and "dist" and "dist_device_sync" are aliases of "dist_sync" and
// "dist_sync_device"; "horovod" is allreduce mode: no servers, the workers sum their pushes among
// themselves through the collectives engine (OpenMPI or Gloo; dtrain/collectives/collectives.h).
//
// Arrays may be in GPU memory (Array::WrapDevice) where dtrain is built with CUDA: "device" and the
// *_device types sum a key's device values on the GPU. "device" keeps that sum on the GPU as the
// key's value (or, with an optimizer set, updates the key's weight there), and so does "local"
// given one device value, as MXNet's local stores do; pulls copy it on the GPU. The *_device types
// stage the sum once through pinned host memory, and "local" (with several values) and the other
// types stage every value through it (docs/design.md, "GPUs"). With gradient compression "device"
// compresses each value on its GPU and sums them on the host. Results equal the host path's.
//
// Calls are asynchronous: Push/Pull/PushPull return an Operation at once; the arrays passed must
// stay untouched until it is done (wait on it, or call WaitAll). Operations on the same key run in
// the order they were issued. Init, Barrier and SetOptimizer block until done.
//
// Errors: invalid calls (unknown key, wrong length, key initialised twice) throw InvalidArgument at
// the call; failures on the way (a server refused, a peer died) surface from Wait as PeerError or
// TimeoutError naming the node.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/common/array.h"
#include "dtrain/compression/compression_spec.h"
#include "dtrain/kvstore/operation.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain {

using Key = int64_t;

class KVStore {
 public:
  // `type` is one of the Types above. Throws InvalidArgument for an unknown type, ConfigError for a
  // dist type without a job.
  // In a process whose DMLC_ROLE is server or scheduler this runs that role and exits the process
  // when the job ends, as MXNet does, so one training binary serves every role.
  static std::unique_ptr<KVStore> Create(const std::string& type);

  virtual ~KVStore() = default;

  virtual std::string type() const = 0;
  virtual int rank() const = 0;
  virtual int num_workers() const = 0;
  // Where this worker's training resumes, in rounds (steps that push every key once): 0, except in
  // a process that replaces a lost worker of a running dist_sync job (dtrain launch
  // --max-restarts), whose rank had completed this many. Its training loop skips that many steps
  // of its data; the Trainer and dtrain-train do.
  virtual int64_t rounds_done() const { return 0; }
  // This process replaces a lost worker of a running job: the job's keys, optimizer (and its
  // state) are on the servers already, and Init and SetOptimizer only record them here.
  virtual bool rejoined() const { return false; }

  // Creates `key` with an initial value. In dist stores, rank 0's value is the one kept; the call
  // returns when the key exists on the servers for every worker.
  virtual void Init(Key key, const Array& value) = 0;
  virtual void Init(std::span<const Key> keys, std::span<const Array> values);

  // `priority` (MXNet's): in dist stores, of the requests waiting to go to a server, those with the
  // highest priority go first (requests for one key keep their order), and a server's replies take
  // their request's priority. MXNet's modules pass -index, so that the layers nearest the input,
  // which the next forward needs first, come back first. The collective store ("horovod") hands a
  // Push's or PushPull's priority to its allreduce (collectives::AllreduceAsync): of the allreduces
  // ready on every rank, the highest priority (rank 0's) runs first, one fusion buffer a round; its
  // Pull, which only waits for this worker's own pushes of the key, ignores it. Local stores ignore
  // it.
  //
  // Adds the sum of `values` (one per local device, all the key's shape) to this round of `key`.
  virtual Operation Push(Key key, std::vector<Array> values, int priority = 0) = 0;
  // Copies the key's current value into every array of `outs`.
  virtual Operation Pull(Key key, std::vector<Array> outs, int priority = 0) = 0;
  // Push, then pull the value that results, in one exchange.
  virtual Operation PushPull(Key key, std::vector<Array> values, std::vector<Array> outs,
                             int priority = 0) = 0;

  // List forms, one entry per key. The returned operation covers all keys.
  Operation Push(std::span<const Key> keys, std::span<const std::vector<Array>> values,
                 int priority = 0);
  Operation Pull(std::span<const Key> keys, std::span<const std::vector<Array>> outs,
                 int priority = 0);
  Operation PushPull(std::span<const Key> keys, std::span<const std::vector<Array>> values,
                     std::span<const std::vector<Array>> outs, int priority = 0);

  // MXNet's row_sparse push and pull, for a key whose value is a matrix (two or more dimensions:
  // rows along the first). PushRows adds to this round of `key` the rows `rows` of a gradient,
  // `values` holding them one after another (rows.size() rows of the key's row shape; ids may
  // repeat and come in any order: repeats are summed); the other rows are zero. PullRows copies
  // the key's rows `rows` into `out` (rows.size() rows), in that order. Dist stores move only
  // those rows (a server applies the optimizer to the rows pushed only: MXNet's lazy_update,
  // unless the optimizer's lazy_update is 0); the others throw InvalidArgument (push and pull
  // the dense value there). Host arrays only.
  virtual Operation PushRows(Key key, std::vector<int64_t> rows, const Array& values,
                             int priority = 0);
  virtual Operation PullRows(Key key, std::vector<int64_t> rows, const Array& out,
                             int priority = 0);

  // Waits for every operation issued so far.
  virtual void WaitAll() = 0;
  // Blocks until every worker has reached the barrier.
  virtual void Barrier() = 0;

  // From now on pushes are applied with this optimizer on the store's side (on the servers for dist
  // stores) and pulls return weights; without one, pulls return the merged sum of the pushes.
  virtual void SetOptimizer(const OptimizerSpec& spec) = 0;

  // MXNet's set_gradient_compression: {"type": "none|2bit|1bit|fp16", "threshold": "T"}, and
  // "min_elements": "N" to send keys under N elements uncompressed (CompressionSpec). Dist
  // stores compress what this worker pushes to the servers, after summing its local devices (init
  // values and pulls are not compressed); local and device stores compress each device's value
  // where several devices' values are summed (a device store's CUDA values on their own GPUs).
  // Call it before the first push. Throws InvalidArgument for a bad type or threshold, a call
  // after a push, a type of store that does not compress (horovod: use DTRAIN_FP16_ALLREDUCE),
  // and, at the push, a key that is not float32.
  virtual void SetGradientCompression(const std::map<std::string, std::string>& params) = 0;
  // What SetGradientCompression set (type none if nothing), so that callers can plan around it.
  virtual CompressionSpec gradient_compression() const { return {}; }

  // The state of the optimizer the store runs (all servers' for dist stores), as opaque bytes to
  // save with a model, and back. Load it into a job of the same layout (same keys, servers).
  // Call while no pushes are in flight. Throws InvalidArgument if no optimizer is set or the
  // bytes do not fit.
  virtual std::string SaveOptimizerState() = 0;
  virtual void LoadOptimizerState(const std::string& state) = 0;

  // The optimizer the store runs takes base learning rate `learning_rate` (the rate a schedule
  // scales) from each key's update number `from_update` on: a key's updates count from 1, as
  // OptimizerSpec's schedules count them, and those numbered below `from_update` keep their rate.
  // A trainer passes its next step, so every key's update of that step uses the new rate, whenever
  // it runs. Call it on every worker with the same values, between steps, as a training script
  // does: a dist store sends rank 0's to every server and returns once they hold it (and have
  // checkpointed it), which is before rank 0 can push that step; other ranks' calls return at once.
  // Throws InvalidArgument without an optimizer or for a bad rate or update number.
  virtual void SetLearningRate(double learning_rate, uint64_t from_update) = 0;
};

}  // namespace dtrain

// ParameterSync's inner records (parameter_sync.cc and parameter_sync_rows.cc share them).
#pragma once

#include <torch/torch.h>

#include <mutex>
#include <vector>

#include "dtrain/train/parameter_sync.h"

namespace dtrain::train {

// Lets go of the caller's lock while the store works (an exchange may complete at once, and
// waits must not hold it), and takes it back on every way out, a throw included: the caller's
// lock as it gave it (the destructor finishes every other bucket after a failed one).
class Unlocked {
 public:
  explicit Unlocked(std::unique_lock<std::mutex>& lock) : lock_(lock) { lock_.unlock(); }
  ~Unlocked() { lock_.lock(); }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  std::unique_lock<std::mutex>& lock_;
};

struct ParameterSync::Param {
  size_t index = 0;
  std::vector<torch::Tensor> weights;  // one per replica
  std::vector<torch::Tensor> grads;    // this step's, per replica (buckets that are not flat)
  std::vector<int> arrived;            // per replica: backward passes that gave a gradient
  std::vector<unsigned> hooks;         // per replica: its gradient hook, removed with the sync
  size_t bucket = 0;
  int64_t offset = 0;  // in its bucket's flat buffers
  int64_t numel = 0;
  // Row-sparse exchange (parameter_sync_rows.cc): a matrix with a key of its own, on the host,
  // trained by a dist store's servers. Once backward has given it a sparse gradient (an
  // embedding's), its steps push only the rows touched, and its weights here are current only in
  // the rows pulled since: `rows_stale` until a whole pull.
  bool rows_capable = false;
  bool sparse_seen = false;
  bool rows_stale = false;
  std::vector<torch::Tensor> sparse_grads;  // this step's, from every replica and pass
};

// What travels under one key: one parameter (its tensors are sent and received in place) or
// several small ones, fused. A flat bucket travels through float32 buffers of its own, copied into
// on the way out and back: several parameters fused, or a float16 or bfloat16 one, whose buffers
// hold float32 gradients and master weights (MXNet's multi_precision: the optimizer updates the
// float32 weights, and the parameter gets them rounded).
struct ParameterSync::Bucket {
  size_t key = 0;
  std::vector<size_t> params;
  int64_t numel = 0;
  bool flat = false;
  std::vector<torch::Tensor> grads;  // flat: per replica, on that replica's device
  torch::Tensor weights;             // flat: weights on replica 0's device (pull target)
  // Optimizer here: the summed gradient, pulled to replica 0's device (the host or a GPU). On a
  // GPU its tensor too: each Issue wraps it with the stream current then, so that the pull
  // waits for the last update that read it even if the caller's stream changed.
  Array summed;
  torch::Tensor summed_on_device;
  int pending = 0;       // gradients still to arrive this step
  bool issued = false;   // this step's exchange has started
  bool finished = true;  // every replica holds the latest weights
  Operation op;
};

}  // namespace dtrain::train

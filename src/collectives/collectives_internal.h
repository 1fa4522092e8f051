// The parts of allreduce mode's process-wide API (dtrain/collectives/collectives.h) that only
// dtrain itself calls: an elastic job's questions to the launcher (for the training front ends'
// elastic loops), the byte broadcast that the horovod store and the elastic state use, and the
// engine's counters.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/collectives/collectives.h"
#include "dtrain/common/deadline.h"

namespace dtrain::collectives {

// Whether this process runs in an elastic job (DTRAIN_ELASTIC=1).
bool IsElastic();
// What changed in an elastic job since this worker's membership formed: Horovod's "hosts
// updated", asked of the launcher at a commit. kRemoved: workers only left (or failed before
// joining), so the members' committed states are still equal and need no sync; kAdded: a new
// worker waits, which needs rank 0's state. kNone outside an elastic job. Throws PeerError or
// TimeoutError when the launcher cannot be asked within `timeout`.
enum class HostsUpdate { kNone, kRemoved, kAdded };
HostsUpdate ElasticHostsUpdate(Duration timeout = Duration(10000));
// The training steps this worker rolls back to its last commit after a failed membership (steps
// it will redo): told to the launcher with its next join, which lists them with the membership
// it forms ("rolled back 12 step(s)"). Ignored outside an elastic job.
void NoteElasticRollback(int64_t steps);

// The front end refused this rank's second collective of `name` in `process_set` (Engine::Refuse).
void RefuseName(const std::string& name, int process_set);

// Root's `bytes` (any length) into everyone's: their length, then (unless empty) the bytes, as two
// broadcasts named `name`.length and `name`.
void BroadcastBytes(const std::string& name, std::string& bytes, int root);

// Counters of this process's engine, for tests and benchmarks (zero before Init).
struct EngineStats {
  uint64_t rounds = 0;         // negotiation rounds (cycles) run
  uint64_t data_calls = 0;     // backend calls that moved tensors: one per fusion buffer
  uint64_t collectives = 0;    // collectives completed (successfully or not)
  uint64_t fused_tensors = 0;  // allreduces that shared a backend call with others
  uint64_t caller_rounds = 0;  // rounds a waiting caller ran itself (Engine::Impl::HelpWithRound)
};
EngineStats Stats();

}  // namespace dtrain::collectives

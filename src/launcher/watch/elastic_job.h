// An elastic allreduce job (`dtrain launch -s 0 --host-discovery-script S --min-np A --max-np B`):
// Horovod's elastic driver. The workers run dtrain.torch.elastic (or any program whose
// collectives start with DTRAIN_ELASTIC=1); the launcher decides who is in the job.
//
//   - Slots. Every second the launcher runs the discovery script; it prints `HOST[:SLOTS]` lines
//     (ElasticHosts says which hosts this launcher can reach and how: --launcher local takes this
//     machine's names only, --launcher ssh any host ssh can use). A worker starts on every free
//     slot, up to max_np in all. A worker that fails retires its slot (Horovod retires the whole
//     host): the slot counts again once the script stops listing its host and lists it again, or
//     lists more slots. A host the script drops has its workers told to leave at their next join.
//   - Memberships. A worker's collectives start by asking the launcher to join (an
//     "elastic_join" request on the report channel, report_server.h). Once every live worker
//     asks, and there are at least min_np, the launcher forms the next membership: ranks by
//     start order (the oldest worker, which holds the committed state, is rank 0), rank 0 opens
//     the gloo rendezvous and says where, the others are told it. A worker that fails breaks the
//     membership: the others' collectives fail, they roll back to their last commit and join
//     again. A new worker waits in its join until the members reach a commit, where they learn
//     (the "elastic_hosts" request) that the job changed and join too; when workers only left,
//     the answer says so and the members skip the sync (Horovod's skip_sync).
//   - Deadlines. Below min_np the job waits elastic_timeout for slots, then fails. A member that
//     does not join a broken membership within elastic_timeout is stopped (SIGKILL), named. When
//     every worker has failed, nobody holds the training state: the job fails.
//   - The end. Once a worker exits 0 and no live worker is left, the job succeeded (0). Workers
//     that never had a rank by then (started on a free slot, waiting for the members' next commit)
//     are told to leave: training is over.
//
// Threads: the launcher's event loop (watch_loop.h).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dtrain/common/deadline.h"
#include "launcher/plan/job_plan.h"
#include "launcher/watch/local_job.h"

namespace dtrain::launcher {

// How an elastic job reaches the hosts its discovery script offers. Called on the launcher's
// event loop; may block it briefly (ssh reads its configuration for a new host).
class ElasticHosts {
 public:
  virtual ~ElasticHosts() = default;
  // Why no worker can run on `host` (said once, and the host ignored while the script lists it;
  // asked again when the script lists it again), or nullopt when one can.
  virtual std::optional<std::string> Refuse(const std::string& host) = 0;
  // `worker` (its rank and variables set) made to run on `host`, which Refuse accepted.
  virtual ProcessSpec Place(const ProcessSpec& worker, const std::string& host) = 0;
};

struct ElasticOptions {
  std::shared_ptr<ElasticHosts> hosts;
  std::string discovery_script;  // run with /bin/sh -c
  int min_np = 1;
  int max_np = 1;
  Duration timeout{600000};  // --elastic-timeout
  Duration discovery_interval{1000};
  Duration discovery_deadline{10000};  // a script that runs longer is killed and ignored
};

// `worker` is the template of every worker: its rank, DTRAIN_NODE_RANK and host are set per
// worker (a worker's number, in start order, is its name: "worker 3"). Returns the launcher's
// exit code.
int SuperviseElasticJob(const ProcessSpec& worker, const SupervisorOptions& options,
                        const ElasticOptions& elastic);

}  // namespace dtrain::launcher

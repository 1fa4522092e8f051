// InProcessJob: a whole dist KVStore job in one process, over one InMemoryNetwork.
//
// A scheduler and the servers run on threads (tests/ps/inprocess_cluster.h); every worker is a
// DistKVStore created on a thread of its own (its constructor joins the job and blocks until every
// node has), which then runs the test's body and is destroyed (which finishes the worker).
//
//   Config config = InMemoryJobConfig(/*servers=*/2, /*workers=*/2);
//   InProcessJob job("dist_sync", config);
//   job.Run([&](DistKVStore& kv) { kv.Init(3, Array({10})); ... });
//   job.ExpectSuccess();
//
// What a worker's constructor or body throws is recorded (worker(i).error), not rethrown, so that
// failure tests can check the message each node got. Every thread is joined on every path; a job
// still running at the hang guard fails the test (see InProcessCluster::Finish).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../ps/inprocess_cluster.h"
#include "kvstore/dist_kvstore.h"

namespace dtrain::testing {

struct WorkerOutcome {
  bool joined = false;     // the DistKVStore constructor returned
  int rank = -1;           // kv.rank()
  int num_workers = -1;    // kv.num_workers()
  std::string error;       // what the constructor or the body threw; "" if nothing
  std::string error_kind;  // "PeerError", "TimeoutError", ...
  Clock::time_point failed_at{};
};

// The class name of a dtrain error, for checks and messages.
std::string ErrorKind(const std::exception& e);

class InProcessJob {
 public:
  using Body = std::function<void(DistKVStore& kv)>;

  InProcessJob(std::string type, Config config, Duration hang_guard = Duration(30000));
  ~InProcessJob();

  // Worker thread i asks for rank i (DTRAIN_NODE_RANK), so that rank == index; with false the
  // scheduler assigns ranks in order of arrival. Call before Run.
  void set_fixed_ranks(bool fixed) { fixed_ranks_ = fixed; }

  // Starts the scheduler, the servers and one thread per worker running `body`, and waits for the
  // whole job to end (bounded by the hang guard).
  void Run(const Body& body);

  InProcessCluster& cluster() { return cluster_; }
  const Config& config() const { return cluster_.config(); }
  transport::InMemoryNetwork& network() { return cluster_.network(); }

  const WorkerOutcome& worker(int index) const { return outcomes_.at(index); }
  // The port of worker thread `index`'s transport; 0 until its DistKVStore has joined.
  uint16_t worker_port(int index) const { return ports_.at(index).load(); }
  // Worker thread `index` dies as a crashed process would. Callable from any body.
  void CrashWorker(int index);

  // Every worker joined and its body returned without an error; every server and the scheduler
  // ended with code 0.
  void ExpectSuccess() const;
  // Text of every outcome, for failure messages.
  std::string Summary() const;

 private:
  void RunWorker(int index, const Body& body);

  const std::string type_;
  bool fixed_ranks_ = true;
  InProcessCluster cluster_;
  std::vector<WorkerOutcome> outcomes_;
  std::vector<std::atomic<uint16_t>> ports_;
};

}  // namespace dtrain::testing

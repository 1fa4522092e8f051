#include "inprocess_job.h"

#include <gtest/gtest.h>

namespace dtrain::testing {

std::string ErrorKind(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const PeerError*>(&e)) return "PeerError";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "InvalidArgument";
  if (dynamic_cast<const ProtocolError*>(&e)) return "ProtocolError";
  if (dynamic_cast<const ConfigError*>(&e)) return "ConfigError";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "std::exception";
}

InProcessJob::InProcessJob(std::string type, Config config, Duration hang_guard)
    : type_(std::move(type)),
      cluster_(std::move(config), hang_guard),
      outcomes_(cluster_.config().num_workers),
      ports_(cluster_.config().num_workers) {}

InProcessJob::~InProcessJob() { cluster_.Finish(); }

void InProcessJob::Run(const Body& body) {
  cluster_.StartScheduler();
  cluster_.StartServers();
  for (int i = 0; i < cluster_.config().num_workers; ++i) {
    cluster_.Spawn("worker thread " + std::to_string(i), [this, i, body] { RunWorker(i, body); });
  }
  cluster_.Finish();
}

void InProcessJob::RunWorker(int index, const Body& body) {
  WorkerOutcome& out = outcomes_[index];
  auto record = [&out](const std::exception& e) {
    out.error = e.what();
    out.error_kind = ErrorKind(e);
    out.failed_at = Clock::now();
  };
  const Config config = cluster_.NodeConfig(Role::kWorker, fixed_ranks_ ? index : -1);
  auto transport = cluster_.NewTransport();
  transport::InMemoryTransport* raw = transport.get();
  try {
    DistKVStore kv(type_, config, std::move(transport), /*exit_on_failure=*/false);
    ports_[index] = raw->port();  // `raw` lives as long as `kv`
    out.joined = true;
    out.rank = kv.rank();
    out.num_workers = kv.num_workers();
    try {
      body(kv);
    } catch (const std::exception& e) {
      record(e);
    }
  } catch (const std::exception& e) {
    record(e);  // the constructor could not join the job
  }
}

void InProcessJob::CrashWorker(int index) {
  const uint16_t port = worker_port(index);
  ASSERT_NE(port, 0) << "worker thread " << index << " has not joined the job";
  cluster_.Crash(port);
}

void InProcessJob::ExpectSuccess() const {
  for (size_t i = 0; i < outcomes_.size(); ++i) {
    EXPECT_TRUE(outcomes_[i].joined) << "worker thread " << i << "\n" << Summary();
    EXPECT_EQ(outcomes_[i].error, "") << "worker thread " << i << "\n" << Summary();
  }
  for (int s = 0; s < cluster_.config().num_servers; ++s) {
    EXPECT_EQ(cluster_.server_code(s), 0) << Summary();
  }
  EXPECT_EQ(cluster_.scheduler_code(), 0) << Summary();
}

std::string InProcessJob::Summary() const {
  std::string s = "scheduler: code " + std::to_string(cluster_.scheduler_code()) + "\n";
  for (int r = 0; r < cluster_.config().num_servers; ++r) {
    s += "server " + std::to_string(r) + ": code " + std::to_string(cluster_.server_code(r)) +
         (cluster_.server_failure(r).empty() ? "" : ", " + cluster_.server_failure(r)) + "\n";
  }
  for (size_t i = 0; i < outcomes_.size(); ++i) {
    const WorkerOutcome& o = outcomes_[i];
    s += "worker thread " + std::to_string(i) + ": " +
         (o.joined ? "rank " + std::to_string(o.rank) : std::string("never joined")) +
         (o.error.empty() ? "" : ", " + o.error_kind + ": " + o.error) + "\n";
  }
  return s;
}

}  // namespace dtrain::testing

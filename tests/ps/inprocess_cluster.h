// InProcessCluster: a job's scheduler and servers as threads of the test process, over one
// InMemoryNetwork, so that the protocol can be tested in one process (as Gloo tests N ranks as
// threads). Workers are up to the test: a Node with a WorkerClient sending messages by hand
// (tests/ps), or DistKVStores (tests/kvstore/inprocess_job.h).
//
//   InProcessCluster cluster(InMemoryJobConfig(/*servers=*/2, /*workers=*/1));
//   cluster.StartScheduler();
//   cluster.StartServers();
//   cluster.Spawn("worker 0", [&] { ... });
//   cluster.Finish();                      // joins every thread
//   EXPECT_EQ(cluster.scheduler_code(), 0);
//
// Every thread the cluster starts is joined on every path (Finish, or the destructor). A job that
// has not ended by the hang guard is a test failure, not a hang: the cluster names the threads
// still running and crashes the scheduler, so that every node fails at once (each has a link to
// it) and their bounded waits end; it then joins them, and if even that does not end them it
// aborts the process rather than block ctest.
//
// Header-only: it is shared by the ps and kvstore test executables.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/config/config.h"
#include "dtrain/common/deadline.h"
#include "dtrain/common/error.h"
#include "ps/node/node.h"
#include "ps/scheduler.h"
#include "ps/server.h"
#include "ps/worker_client.h"
#include "support/transport/inmemory_transport.h"

namespace dtrain::testing {

using namespace std::chrono_literals;

// A job on the in-memory network, with deadlines short enough that a failing test fails within
// seconds, and long enough for a loaded machine (the machines running tests are shared).
inline Config InMemoryJobConfig(int num_servers, int num_workers) {
  Config c;
  c.scheduler_host = "inmem";
  c.scheduler_port = 0;  // set by InProcessCluster::StartScheduler
  c.node_host = "inmem";
  c.num_servers = num_servers;
  c.num_workers = num_workers;
  c.connect_timeout = 2000ms;
  c.start_timeout = 5000ms;
  c.request_timeout = 10000ms;
  c.heartbeat_interval = 100ms;
  c.heartbeat_timeout = 10000ms;
  c.reduction_threads = 2;
  return c;
}

// Threads that are always joined. A function that throws is a test failure (tests record the
// errors they expect themselves).
class ThreadGroup {
 public:
  ThreadGroup() = default;
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;
  ~ThreadGroup() { JoinAll(); }

  void Spawn(std::string name, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.emplace_back();
    Entry* e = &entries_.back();
    e->name = std::move(name);
    e->thread = std::thread([this, e, fn = std::move(fn)] {
      try {
        fn();
      } catch (const std::exception& ex) {
        ADD_FAILURE() << e->name << " threw: " << ex.what();
      } catch (...) {
        ADD_FAILURE() << e->name << " threw something that is not a std::exception";
      }
      std::lock_guard<std::mutex> lock(mutex_);
      e->done = true;
      cv_.notify_all();
    });
  }

  // Waits until every thread has returned or the deadline passes; returns the names of those still
  // running.
  std::vector<std::string> WaitAll(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_until(lock, deadline.at(), [this] {
      for (const Entry& e : entries_) {
        if (!e.done) return false;
      }
      return true;
    });
    std::vector<std::string> running;
    for (const Entry& e : entries_) {
      if (!e.done) running.push_back(e.name);
    }
    return running;
  }

  // Joins without holding the lock: a thread takes it to mark itself done. Threads are spawned
  // only by the test's thread, which is also the one joining, so the list does not change here.
  void JoinAll() {
    for (Entry& e : entries_) {
      if (e.thread.joinable()) e.thread.join();
    }
  }

 private:
  struct Entry {
    std::string name;
    std::thread thread;
    bool done = false;
  };

  std::mutex mutex_;
  std::condition_variable cv_;
  std::list<Entry> entries_;  // a list: threads keep pointers to their entries
};

class InProcessCluster {
 public:
  explicit InProcessCluster(Config config, Duration hang_guard = 30000ms)
      : config_(std::move(config)),
        network_(std::make_shared<transport::InMemoryNetwork>()),
        guard_(hang_guard),
        server_ports_(config_.num_servers),
        server_codes_(config_.num_servers, -1),
        server_failures_(config_.num_servers) {}

  ~InProcessCluster() { Finish(); }

  InProcessCluster(const InProcessCluster&) = delete;
  InProcessCluster& operator=(const InProcessCluster&) = delete;

  transport::InMemoryNetwork& network() { return *network_; }
  const std::shared_ptr<transport::InMemoryNetwork>& shared_network() const { return network_; }
  // The job's configuration; scheduler_port is valid once StartScheduler has returned.
  const Config& config() const { return config_; }

  std::unique_ptr<transport::InMemoryTransport> NewTransport() {
    return std::make_unique<transport::InMemoryTransport>(network_);
  }

  // Binds the scheduler on the calling thread (so that config().scheduler_port is known at once)
  // and runs it on a thread of its own.
  void StartScheduler() {
    auto scheduler = std::make_shared<ps::Scheduler>(config_, NewTransport());
    config_.scheduler_port = scheduler->Listen();
    scheduler_port_ = config_.scheduler_port;
    threads_.Spawn("scheduler", [this, scheduler]() mutable {
      int code = -1;
      try {
        code = scheduler->Run();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "Scheduler::Run threw: " << e.what();
      }
      scheduler.reset();  // shuts its transport down on this thread
      scheduler_code_ = code;
    });
  }

  // Changes the configuration of the nodes started from now on (e.g. after StartScheduler, so
  // that the scheduler and the other nodes differ).
  void Tune(const std::function<void(Config&)>& change) { change(config_); }

  // For tests that play the scheduler themselves (with a bare transport listening at `port`).
  void UseScheduler(uint16_t port) {
    config_.scheduler_port = port;
    scheduler_port_ = port;
  }

  // Server `rank` as `dtrain server` runs it (ps/roles.cc): Node + Server until the job ends.
  void StartServers() {
    for (int r = 0; r < config_.num_servers; ++r) {
      threads_.Spawn("server " + std::to_string(r), [this, r] { RunServer(r); });
    }
  }

  void Spawn(std::string name, std::function<void()> fn) {
    threads_.Spawn(std::move(name), std::move(fn));
  }

  // The configuration of a server or worker with the given (requested) rank.
  Config NodeConfig(Role role, int rank) const {
    Config c = config_;
    c.role = role;
    c.requested_rank = rank;
    return c;
  }

  uint16_t scheduler_port() const { return scheduler_port_; }
  // 0 until the server has joined the job.
  uint16_t server_port(int rank) const { return server_ports_.at(rank).load(); }

  // Kills a node as a crashed process would die (InMemoryNetwork::Crash).
  void Crash(uint16_t port) { network_->Crash(port); }

  // Waits for every thread, up to the hang guard (counted from construction); then joins them.
  void Finish() {
    if (finished_) return;
    finished_ = true;
    auto running = threads_.WaitAll(guard_);
    if (!running.empty()) {
      std::string names;
      for (const auto& n : running) names += (names.empty() ? "" : ", ") + n;
      ADD_FAILURE() << "the job hung: still running after " << Seconds(guard_.timeout())
                    << " s: " << names << "; crashing the scheduler to end it";
      try {
        // Not the other nodes: a crashed node never hears of the failure its peers report.
        if (scheduler_port_ != 0) network_->Crash(scheduler_port_);
      } catch (const Error&) {
        // Gone already; the nodes notice its silence within PS_HEARTBEAT_TIMEOUT.
      }
      // Every wait in dtrain is bounded by one of these once its peers are gone.
      const Duration grace =
          config_.request_timeout + config_.heartbeat_timeout + config_.start_timeout + 5000ms;
      running = threads_.WaitAll(Deadline(grace));
      if (!running.empty()) {
        std::fprintf(stderr,
                     "InProcessCluster: %zu thread(s) still running %g s after crashing "
                     "the scheduler; aborting rather than hanging\n",
                     running.size(), Seconds(grace));
        std::abort();
      }
    }
    threads_.JoinAll();
  }

  // Valid after Finish.
  int scheduler_code() const { return scheduler_code_.load(); }
  int server_code(int rank) const { return server_codes_.at(rank); }
  // The server node's failure ("" if none), or what its thread threw.
  const std::string& server_failure(int rank) const { return server_failures_.at(rank); }

 private:
  void RunServer(int rank) {
    const Config config = NodeConfig(Role::kServer, rank);
    auto transport = NewTransport();
    transport::InMemoryTransport* raw = transport.get();
    int code = 1;
    std::string failure;
    try {
      ps::Node node(config, Role::kServer, std::move(transport), ps::Node::Options{});
      ps::Server server(node, config);
      node.SetDataHandler([&server](transport::Message&& msg) { server.Handle(std::move(msg)); });
      node.SetWorkerFinishedHandler([&server](int r) { server.OnWorkerFinished(r); });
      node.SetBodyLimit([&server](const transport::Header& h) { return server.BodyLimit(h); });
      try {
        node.Start();
        server_ports_[rank] = raw->port();
        code = node.WaitForTermination();
        failure = node.failure().value_or("");
      } catch (const std::exception& e) {
        failure = e.what();
      }
      node.Shutdown();  // before `server` goes: no handler may run into a destroyed Server
    } catch (const std::exception& e) {
      failure = e.what();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    server_codes_[rank] = code;
    server_failures_[rank] = failure;
  }

  Config config_;
  std::shared_ptr<transport::InMemoryNetwork> network_;
  const Deadline guard_;
  bool finished_ = false;
  uint16_t scheduler_port_ = 0;
  std::vector<std::atomic<uint16_t>> server_ports_;
  std::atomic<int> scheduler_code_{-1};
  mutable std::mutex mutex_;
  std::vector<int> server_codes_;
  std::vector<std::string> server_failures_;
  ThreadGroup threads_;  // last: joined (by Finish or its destructor) before the rest goes
};

}  // namespace dtrain::testing

// End-to-end tests of the parameter server: a scheduler, servers and workers as real processes on
// loopback, started by hand with the DMLC_* variables (the launcher has tests of its own).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"
#include "subprocess.h"
#include "transport/tcp/tcp_transport.h"

namespace dtrain::testing {
namespace {

constexpr int kHangGuardMs = 120000;  // a job that has not ended by then is hung

struct Job {
  // fixed_ports: every node listens at a port chosen here (node_ports), for tests that visit them.
  Job(int workers, int servers, std::vector<std::string> worker_args,
      std::map<std::string, std::string> extra_env = {}, bool fixed_ports = false) {
    env = {{"DMLC_PS_ROOT_URI", "127.0.0.1"},
           {"DMLC_PS_ROOT_PORT", std::to_string(FreePort())},
           {"DMLC_NUM_SERVER", std::to_string(servers)},
           {"DMLC_NUM_WORKER", std::to_string(workers)},
           {"DMLC_NODE_HOST", "127.0.0.1"}};
    for (auto& [k, v] : extra_env) env[k] = v;
    node_ports.push_back(std::stoi(env["DMLC_PS_ROOT_PORT"]));
    auto with_role = [this, fixed_ports](const char* role, int rank) {
      auto e = env;
      e["DMLC_ROLE"] = role;
      e["DTRAIN_NODE_RANK"] = std::to_string(rank);
      if (fixed_ports && std::string(role) != "scheduler") {
        node_ports.push_back(FreePort());
        e["DMLC_NODE_PORT"] = std::to_string(node_ports.back());
      }
      return e;
    };
    scheduler = std::make_unique<Subprocess>(
        std::vector<std::string>{BinaryPath("src/tools/dtrain"), "scheduler"},
        with_role("scheduler", 0), dir.path() + "/scheduler.log");
    for (int s = 0; s < servers; ++s) {
      this->servers.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{BinaryPath("src/tools/dtrain"), "server"},
          with_role("server", s), dir.path() + "/server" + std::to_string(s) + ".log"));
    }
    std::vector<std::string> argv = {BinaryPath("tests/programs/kv_check_worker")};
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    for (int w = 0; w < workers; ++w) {
      this->workers.push_back(std::make_unique<Subprocess>(
          argv, with_role("worker", w), dir.path() + "/worker" + std::to_string(w) + ".log"));
    }
  }

  std::string AllOutput() {
    std::string out = "--- scheduler\n" + scheduler->Output();
    for (size_t i = 0; i < servers.size(); ++i) {
      out += "--- server " + std::to_string(i) + "\n" + servers[i]->Output();
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      out += "--- worker " + std::to_string(i) + "\n" + workers[i]->Output();
    }
    return out;
  }

  // Every process ends with code 0.
  void ExpectSuccess() {
    for (auto* group : {&workers, &servers}) {
      for (auto& p : *group) {
        auto code = p->Wait(kHangGuardMs);
        ASSERT_TRUE(code.has_value()) << "hung:\n" << AllOutput();
        EXPECT_EQ(*code, 0) << AllOutput();
      }
    }
    auto code = scheduler->Wait(kHangGuardMs);
    ASSERT_TRUE(code.has_value()) << "scheduler hung:\n" << AllOutput();
    EXPECT_EQ(*code, 0) << AllOutput();
  }

  TempDir dir;
  std::map<std::string, std::string> env;
  std::vector<int> node_ports;  // the scheduler's, then (fixed_ports) the servers' and workers'
  std::unique_ptr<Subprocess> scheduler;
  std::vector<std::unique_ptr<Subprocess>> servers;
  std::vector<std::unique_ptr<Subprocess>> workers;
};

struct Layout {
  int workers;
  int servers;
};

class PsJobTest : public ::testing::TestWithParam<Layout> {};

TEST_P(PsJobTest, SyncPullsReturnExactlyTheRoundSum) {
  // Sizes straddle the big-array bound, so some keys go whole to one server and others are split
  // over all of them and cut into several slots each.
  Job job(GetParam().workers, GetParam().servers,
          {"--scenario", "sync", "--rounds", "12", "--sizes",
           "1,3,1000,4096,99999,100000,250001,1200000"},
          {{"MXNET_KVSTORE_BIGARRAY_BOUND", "100000"}, {"DTRAIN_CHUNK_BYTES", "262144"}});
  job.ExpectSuccess();
}

TEST_P(PsJobTest, SyncWithDefaultSettingsAndSeveralDevices) {
  Job job(GetParam().workers, GetParam().servers,
          {"--scenario", "sync", "--rounds", "4", "--devices", "3"});
  job.ExpectSuccess();
}

TEST_P(PsJobTest, AsyncFinalValueIsTheTotalOfAllPushes) {
  Job job(GetParam().workers, GetParam().servers,
          {"--scenario", "async", "--rounds", "15", "--sizes", "1,1000,300000,1200000"});
  job.ExpectSuccess();
}

TEST_P(PsJobTest, BarrierHoldsEveryoneUntilTheLastArrives) {
  TempDir marks;
  Job job(GetParam().workers, GetParam().servers,
          {"--scenario", "barrier", "--rounds", "3", "--dir", marks.path()});
  job.ExpectSuccess();
}

INSTANTIATE_TEST_SUITE_P(Layouts, PsJobTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 2}, Layout{4, 2}, Layout{3, 1}),
                         [](const auto& info) {
                           return std::to_string(info.param.workers) + "workers" +
                                  std::to_string(info.param.servers) + "servers";
                         });

// A connected socket to 127.0.0.1:port, or -1 if nothing listens there.
int ConnectToLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A stranger's visit to 127.0.0.1:port, as port scanners, health checks and stray clients make
// them. Returns false if nothing listened there.
bool VisitAsAStranger(int port, int kind, std::mt19937& rng) {
  const int fd = ConnectToLoopback(port);
  if (fd < 0) return false;
  std::string bytes;
  if (kind == 1) {  // 4 KB of noise
    bytes.resize(4096);
    for (char& c : bytes) c = static_cast<char>(rng());
  } else if (kind == 2) {  // half of a frame header, then nothing
    bytes.assign(8, '\0');
  }
  if (!bytes.empty()) (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  ::close(fd);  // kind 0: connect and close at once
  return true;
}

// While a 2x2 dist_sync job runs, strangers connect and close, send noise and half frames to
// every node's port, and some stay connected and silent (closed after DTRAIN_HELLO_TIMEOUT_MS): the
// job ends as an undisturbed one does, every pull exact (kv_check_worker checks each round's sum).
TEST(PsJobStrangers, VisitsToEveryPortDoNotDisturbTheJob) {
  Job job(2, 2, {"--scenario", "sync", "--rounds", "1500", "--sizes", "1,1000,100000"},
          {{"DTRAIN_HELLO_TIMEOUT_MS", "200"}}, /*fixed_ports=*/true);
  std::mt19937 rng(7);
  struct Silent {
    int fd;
    std::chrono::steady_clock::time_point since;
    bool closed_by_node = false;
  };
  std::vector<Silent> silent;
  int visits_while_running = 0;
  int silent_closed_while_running = 0;
  const auto running = [&] { return job.workers[0]->Running() && job.workers[1]->Running(); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0; running() && std::chrono::steady_clock::now() < deadline; ++i) {
    for (int port : job.node_ports) {
      if (VisitAsAStranger(port, i % 3, rng)) ++visits_while_running;
    }
    const auto now = std::chrono::steady_clock::now();
    if (i % 10 == 0 && silent.size() < 8) {  // one that connects and stays, saying nothing
      const int fd = ConnectToLoopback(job.node_ports[i / 10 % job.node_ports.size()]);
      if (fd >= 0) silent.push_back({fd, now});
    }
    // Well past the hello deadline, the node has closed a silent connection: we read its end.
    for (Silent& s : silent) {
      if (s.closed_by_node || now - s.since < std::chrono::milliseconds(1000)) continue;
      char byte;
      if (::recv(s.fd, &byte, 1, MSG_DONTWAIT) == 0) {
        s.closed_by_node = true;
        ++silent_closed_while_running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  job.ExpectSuccess();
  for (const Silent& s : silent) ::close(s.fd);
  // Enough visits landed while the job trained for the test to mean something.
  EXPECT_GE(visits_while_running, 3 * static_cast<int>(job.node_ports.size())) << job.AllOutput();
  EXPECT_GE(silent_closed_while_running, 1)
      << "no node closed a connection that never said hello (" << silent.size() << " made)";
  for (int w = 0; w < 2; ++w) {
    EXPECT_NE(job.workers[w]->Output().find("sync OK"), std::string::npos) << job.AllOutput();
  }
  EXPECT_NE(job.scheduler->Output().find("never introduced itself"), std::string::npos)
      << job.AllOutput();
}

// The error text of a connection attempt to 127.0.0.1:port with `secret` ("" if it connected).
std::string HandshakeError(int port, const std::string& secret) {
  transport::TcpOptions options;
  options.job_secret = secret;
  options.streams_per_peer = 1;
  options.io_threads = 1;
  transport::TcpTransport t(options);
  try {
    t.Connect(1, {"127.0.0.1", static_cast<uint16_t>(port)}, 1, Deadline(Duration(10000)));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// With DTRAIN_JOB_SECRET set, while a 2x2 dist_sync job trains: at every node's port, handshakes
// without the secret and with a wrong one are refused, and a worker started with a wrong secret or
// none fails at once saying so; the job ends as an undisturbed one does.
TEST(PsJobStrangers, WithASecretNobodyElseJoinsOrDisturbs) {
  const std::string secret = "a-secret-for-this-test-only-42";
  Job job(2, 2, {"--scenario", "sync", "--rounds", "600", "--sizes", "1,1000,100000"},
          {{"DTRAIN_JOB_SECRET", secret}}, /*fixed_ports=*/true);
  const auto running = [&] { return job.workers[0]->Running() && job.workers[1]->Running(); };
  int refused_while_running = 0;
  std::string unexpected;
  for (int i = 0; i < 3 && running(); ++i) {
    for (int port : job.node_ports) {
      const std::string none = HandshakeError(port, "");
      const std::string wrong = HandshakeError(port, "not-the-secret-of-this-job");
      if (none.find("requires DTRAIN_JOB_SECRET") != std::string::npos &&
          wrong.find("does not know this job's DTRAIN_JOB_SECRET") != std::string::npos) {
        ++refused_while_running;
      } else if (running()) {
        unexpected += "port " + std::to_string(port) + ": [" + none + "] [" + wrong + "]\n";
      }
    }
  }
  TempDir dir;
  auto intruder = [&](const std::string& its_secret, const std::string& name) {
    auto env = job.env;
    env["DMLC_ROLE"] = "worker";
    if (its_secret.empty()) {
      env.erase("DTRAIN_JOB_SECRET");
    } else {
      env["DTRAIN_JOB_SECRET"] = its_secret;
    }
    env["DTRAIN_CONNECT_TIMEOUT_MS"] = "5000";
    return std::make_unique<Subprocess>(
        std::vector<std::string>{BinaryPath("tests/programs/kv_check_worker"), "--scenario", "sync",
                                 "--rounds", "1"},
        env, dir.path() + "/" + name + ".log");
  };
  auto wrong = intruder("not-the-secret-of-this-job", "wrong");
  auto none = intruder("", "none");
  for (auto* p : {wrong.get(), none.get()}) {
    auto code = p->Wait(kHangGuardMs);
    ASSERT_TRUE(code.has_value()) << "an intruder hung:\n" << p->Output();
    EXPECT_NE(*code, 0) << p->Output();
  }
  EXPECT_NE(wrong->Output().find("does not know this job's DTRAIN_JOB_SECRET"), std::string::npos)
      << wrong->Output();
  EXPECT_NE(none->Output().find("requires DTRAIN_JOB_SECRET, which is not set here"),
            std::string::npos)
      << none->Output();
  job.ExpectSuccess();
  EXPECT_TRUE(unexpected.empty()) << unexpected;
  EXPECT_GE(refused_while_running, static_cast<int>(job.node_ports.size())) << job.AllOutput();
  for (int w = 0; w < 2; ++w) {
    EXPECT_NE(job.workers[w]->Output().find("sync OK"), std::string::npos) << job.AllOutput();
  }
  EXPECT_NE(job.scheduler->Output().find("did not authenticate"), std::string::npos)
      << job.AllOutput();
}

// A node of the job's own (right secret, right scheduler) that comes when every place is taken is
// refused, told why, and exits non-zero; its leaving is not a member's failure.
TEST(PsJobErrors, ExtraNodesAreRefusedAndTheJobGoesOn) {
  const std::string secret = "a-secret-for-this-test-only-42";
  Job job(2, 1, {"--scenario", "sync", "--rounds", "60", "--round-pause-ms", "100"},
          {{"DTRAIN_JOB_SECRET", secret}});
  TempDir dir;
  std::vector<std::unique_ptr<Subprocess>> extras;
  for (const char* role : {"worker", "server", "worker"}) {
    auto env = job.env;
    env["DMLC_ROLE"] = role;
    std::vector<std::string> argv = {BinaryPath("src/tools/dtrain"), "server"};
    if (std::string(role) == "worker") {
      argv = {BinaryPath("tests/programs/kv_check_worker"), "--scenario", "sync", "--rounds", "1"};
    }
    // One at a time, each after the job started, so that every refusal meets a running job.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    extras.push_back(std::make_unique<Subprocess>(
        argv, env, dir.path() + "/extra" + std::to_string(extras.size()) + ".log"));
    auto code = extras.back()->Wait(kHangGuardMs);
    ASSERT_TRUE(code.has_value()) << "an extra node hung:\n" << extras.back()->Output();
    EXPECT_NE(*code, 0) << extras.back()->Output();
    const std::string want = std::string("the job already has its ") +
                             (std::string(role) == "worker" ? "2 worker(s)" : "1 server(s)");
    EXPECT_NE(extras.back()->Output().find(want), std::string::npos) << extras.back()->Output();
  }
  ASSERT_TRUE(job.workers[0]->Running() && job.workers[1]->Running())
      << "the job ended before the extra nodes came; give it more rounds\n"
      << job.AllOutput();
  job.ExpectSuccess();
  EXPECT_EQ(job.scheduler->Output().find("failed"), std::string::npos) << job.AllOutput();
}

TEST(PsJobErrors, ApiMisuseGivesClearErrors) {
  Job job(1, 1, {"--scenario", "errors"});
  job.ExpectSuccess();
  EXPECT_NE(job.workers[0]->Output().find("errors OK"), std::string::npos) << job.AllOutput();
}

TEST(PsJobErrors, WorkerKilledMidJobFailsEveryOtherProcessNamingIt) {
  Job job(3, 2, {"--scenario", "die", "--die-rank", "1", "--die-after", "5"});
  for (int w : {0, 2}) {
    auto code = job.workers[w]->Wait(kHangGuardMs);
    ASSERT_TRUE(code.has_value()) << "hung:\n" << job.AllOutput();
    EXPECT_NE(*code, 0);
    EXPECT_NE(job.workers[w]->Output().find("worker 1 (127.0.0.1:"), std::string::npos)
        << job.AllOutput();
  }
  for (auto& s : job.servers) {
    auto code = s->Wait(kHangGuardMs);
    ASSERT_TRUE(code.has_value()) << "server hung:\n" << job.AllOutput();
    EXPECT_NE(*code, 0);
  }
  auto code = job.scheduler->Wait(kHangGuardMs);
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_NE(job.scheduler->Output().find("worker 1 (127.0.0.1:"), std::string::npos);
}

TEST(PsJobErrors, ServerKilledMidJobFailsTheWorkersNamingIt) {
  // --die-rank -1: nobody dies on purpose; the workers push and pull until the job fails.
  Job job(2, 2, {"--scenario", "die", "--die-rank", "-1"});
  // Let the job get going, then kill server 1 as a crash would.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_TRUE(job.servers[1]->Running()) << job.AllOutput();
  job.servers[1]->Kill(SIGKILL);
  for (auto& w : job.workers) {
    auto code = w->Wait(kHangGuardMs);
    ASSERT_TRUE(code.has_value()) << "hung:\n" << job.AllOutput();
    EXPECT_NE(*code, 0);
    EXPECT_NE(w->Output().find("server 1 (127.0.0.1:"), std::string::npos) << job.AllOutput();
  }
}

TEST(PsJobErrors, MissingSchedulerIsAnErrorWithinTheDeadline) {
  TempDir dir;
  Subprocess worker({BinaryPath("tests/programs/kv_check_worker")},
                    {{"DMLC_ROLE", "worker"},
                     {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                     {"DMLC_PS_ROOT_PORT", std::to_string(FreePort())},
                     {"DMLC_NUM_SERVER", "1"},
                     {"DMLC_NUM_WORKER", "1"},
                     {"DTRAIN_CONNECT_TIMEOUT_MS", "1500"}},
                    dir.path() + "/worker.log");
  auto code = worker.Wait(kHangGuardMs);
  ASSERT_TRUE(code.has_value()) << "hung: " << worker.Output();
  EXPECT_NE(*code, 0);
  EXPECT_NE(worker.Output().find("cannot reach the scheduler at 127.0.0.1:"), std::string::npos)
      << worker.Output();
}

struct BadEnv {
  std::map<std::string, std::string> env;
  std::string expected;
};

class PsBadEnvTest : public ::testing::TestWithParam<BadEnv> {};

TEST_P(PsBadEnvTest, NamesTheVariable) {
  TempDir dir;
  std::map<std::string, std::string> env = {
      {"DMLC_ROLE", "worker"},    {"DMLC_PS_ROOT_URI", "127.0.0.1"},
      {"DMLC_PS_ROOT_PORT", "9"}, {"DMLC_NUM_SERVER", "1"},
      {"DMLC_NUM_WORKER", "1"},   {"DTRAIN_CONNECT_TIMEOUT_MS", "1000"}};
  for (auto& [k, v] : GetParam().env) {
    if (v == "<unset>") {
      env.erase(k);
    } else {
      env[k] = v;
    }
  }
  Subprocess worker({BinaryPath("tests/programs/kv_check_worker")}, env,
                    dir.path() + "/worker.log");
  auto code = worker.Wait(kHangGuardMs);
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_NE(worker.Output().find(GetParam().expected), std::string::npos) << worker.Output();
}

INSTANTIATE_TEST_SUITE_P(
    Variables, PsBadEnvTest,
    ::testing::Values(BadEnv{{{"DMLC_ROLE", "wrker"}}, "DMLC_ROLE='wrker'"},
                      BadEnv{{{"DMLC_NUM_WORKER", "two"}}, "DMLC_NUM_WORKER='two'"},
                      BadEnv{{{"DMLC_PS_ROOT_PORT", "70000"}}, "DMLC_PS_ROOT_PORT=70000"},
                      BadEnv{{{"DMLC_PS_ROOT_URI", "<unset>"}}, "DMLC_PS_ROOT_URI is not set"},
                      BadEnv{{{"DMLC_NUM_SERVER", "0"}}, "DMLC_NUM_SERVER"},
                      BadEnv{{{"PS_VERBOSE", "7"}}, "PS_VERBOSE=7"},
                      BadEnv{{{"MXNET_KVSTORE_BIGARRAY_BOUND", "-5"}},
                             "MXNET_KVSTORE_BIGARRAY_BOUND=-5"},
                      BadEnv{{{"DMLC_INTERFACE", "nosuchif0"}}, "DMLC_INTERFACE=nosuchif0"}));

}  // namespace
}  // namespace dtrain::testing

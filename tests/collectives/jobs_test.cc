// Whole collectives jobs of real processes: collectives_check started N times by hand for gloo
// (rendezvous with rank 0 over TCP, or through a shared directory) and under a real mpirun for
// MPI. Every wait is bounded; a hang fails the test and the processes are killed.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include "../integration/subprocess.h"

namespace dtrain::testing {
namespace {

constexpr int kHangGuardMs = 180000;

using Env = std::map<std::string, std::string>;

std::string Check() { return BinaryPath("tests/collectives_check"); }

// A job's processes; the destructor (Subprocess's) kills whatever is left.
struct Job {
  std::vector<std::unique_ptr<Subprocess>> processes;

  // Exit codes in order; a process still running at the deadline fails the test.
  std::vector<int> Wait() {
    std::vector<int> codes;
    for (auto& p : processes) {
      auto code = p->Wait(kHangGuardMs);
      EXPECT_TRUE(code.has_value()) << "hung:\n" << p->Output();
      codes.push_back(code.value_or(-1));
    }
    return codes;
  }
  std::string Output() const {
    std::string all;
    for (const auto& p : processes) all += p->Output();
    return all;
  }
};

enum class Rendezvous { kTcp, kFileStore };

// `rank_env` adds to (or overrides) `env` for single ranks.
std::unique_ptr<Job> StartGloo(const TempDir& dir, int n, std::vector<std::string> args,
                               Env env = {}, Rendezvous rendezvous = Rendezvous::kTcp,
                               std::map<int, Env> rank_env = {}) {
  auto job = std::make_unique<Job>();
  const std::string port = std::to_string(FreePort());
  for (int r = 0; r < n; ++r) {
    Env e = env;
    for (const auto& [name, value] : rank_env[r]) e[name] = value;
    e["DTRAIN_COLLECTIVES"] = "gloo";
    e["DTRAIN_NODE_RANK"] = std::to_string(r);
    e["DMLC_NUM_WORKER"] = std::to_string(n);
    if (rendezvous == Rendezvous::kTcp) {
      e["DMLC_PS_ROOT_URI"] = "127.0.0.1";
      e["DMLC_PS_ROOT_PORT"] = port;
    } else {
      e["DTRAIN_GLOO_FILE_STORE"] = dir.path() + "/store";
    }
    std::vector<std::string> argv = {Check()};
    argv.insert(argv.end(), args.begin(), args.end());
    job->processes.push_back(
        std::make_unique<Subprocess>(argv, e, dir.path() + "/rank" + std::to_string(r) + ".log"));
  }
  return job;
}

std::unique_ptr<Job> StartMpi(const TempDir& dir, int n, std::vector<std::string> args,
                              Env env = {}) {
  auto job = std::make_unique<Job>();
  // Root in a container: --allow-run-as-root; more ranks than cores: --oversubscribe; no CMA in
  // containers: the vader single-copy mechanism off.
  env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none";
  std::vector<std::string> argv = {"/usr/bin/mpirun", "--allow-run-as-root",
                                   "--oversubscribe", "-np",
                                   std::to_string(n), Check()};
  argv.insert(argv.end(), args.begin(), args.end());
  job->processes.push_back(std::make_unique<Subprocess>(argv, env, dir.path() + "/mpirun.log"));
  return job;
}

void ExpectAllSucceed(Job& job, const std::string& expected_line, int n) {
  const auto codes = job.Wait();
  const std::string out = job.Output();
  for (int code : codes) EXPECT_EQ(code, 0) << out;
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(out.find("[rank " + std::to_string(r) + "] " + expected_line), std::string::npos)
        << out;
    if (expected_line == "exact OK") {
      // Every rank runs on this host: the local layout is the global one.
      const std::string layout = "rank " + std::to_string(r) + " of " + std::to_string(n) +
                                 ", local " + std::to_string(r) + " of " + std::to_string(n);
      EXPECT_NE(out.find(layout), std::string::npos) << out;
    }
  }
}

std::vector<std::string> Exact(int64_t max_elements) {
  return {"--scenario", "exact", "--max-elements", std::to_string(max_elements)};
}

// --- exact results: 2 ranks up to 64 MB tensors, 3 and 4 ranks smaller ------------------------

TEST(GlooJob, TwoRanksExactUpTo64MB) {
  TempDir dir;
  auto job = StartGloo(dir, 2, Exact(int64_t{1} << 24));
  ExpectAllSucceed(*job, "exact OK", 2);
}

TEST(GlooJob, ThreeRanksExact) {
  TempDir dir;
  auto job = StartGloo(dir, 3, Exact(int64_t{1} << 20));
  ExpectAllSucceed(*job, "exact OK", 3);
}

TEST(GlooJob, FourRanksExact) {
  TempDir dir;
  auto job = StartGloo(dir, 4, Exact(65539));
  ExpectAllSucceed(*job, "exact OK", 4);
}

// Every rank on this host: the collectives go through shared memory (shm_group.h) unless
// DTRAIN_GLOO_SHM=0, and then through gloo's loopback TCP, which stays exact up to 64 MB.
const Env kVerbose = {{"PS_VERBOSE", "1"}};
const Env kNoSharedMemory = {{"DTRAIN_GLOO_SHM", "0"}, {"PS_VERBOSE", "1"}};
constexpr const char* kSharedMemoryLine = "shared memory among all ranks";

TEST(GlooJob, RanksOfOneHostShareMemoryAndStayExact) {
  TempDir dir;
  auto job = StartGloo(dir, 3, Exact(int64_t{1} << 22), kVerbose);
  ExpectAllSucceed(*job, "exact OK", 3);
  for (auto& p : job->processes) EXPECT_NE(p->Output().find(kSharedMemoryLine), std::string::npos);
}

TEST(GlooJob, TwoRanksExactUpTo64MBOverLoopbackTcp) {
  TempDir dir;
  auto job = StartGloo(dir, 2, Exact(int64_t{1} << 24), kNoSharedMemory);
  ExpectAllSucceed(*job, "exact OK", 2);
  EXPECT_EQ(job->Output().find(kSharedMemoryLine), std::string::npos) << job->Output();
}

// Four ranks on gloo's TCP: allgathers of small blocks (and every negotiation round) go to every
// peer directly, bigger ones around gloo's ring; both must put every rank's rows in place.
TEST(GlooJob, FourRanksExactOverLoopbackTcp) {
  TempDir dir;
  auto job = StartGloo(dir, 4, Exact(65539), kNoSharedMemory);
  ExpectAllSucceed(*job, "exact OK", 4);
  EXPECT_EQ(job->Output().find(kSharedMemoryLine), std::string::npos) << job->Output();
}

TEST(GlooJob, OneRankWithoutSharedMemoryKeepsEveryRankOnTcp) {
  TempDir dir;
  auto job = StartGloo(dir, 3, Exact(65539), kVerbose, Rendezvous::kTcp,
                       {{2, {{"DTRAIN_GLOO_SHM", "0"}}}});
  ExpectAllSucceed(*job, "exact OK", 3);
  EXPECT_EQ(job->Output().find(kSharedMemoryLine), std::string::npos) << job->Output();
  EXPECT_NE(job->processes[0]->Output().find("another rank is not ready"), std::string::npos)
      << job->Output();
}

TEST(GlooJob, FileStoreRendezvous) {
  TempDir dir;
  auto job = StartGloo(dir, 3, Exact(65539), {}, Rendezvous::kFileStore);
  ExpectAllSucceed(*job, "exact OK", 3);
}

TEST(GlooJob, EveryAllreduceAlgorithmIsExact) {
  for (const char* algorithm : {"ring", "ring_chunked", "halving_doubling", "bcube"}) {
    TempDir dir;
    auto job = StartGloo(dir, 3, Exact(65539), {{"DTRAIN_GLOO_ALGORITHM", algorithm}});
    ExpectAllSucceed(*job, "exact OK", 3);
  }
}

TEST(MpiJob, TwoRanksExactUpTo64MB) {
  TempDir dir;
  auto job = StartMpi(dir, 2, Exact(int64_t{1} << 24));
  ExpectAllSucceed(*job, "exact OK", 2);
}

TEST(MpiJob, ThreeRanksExact) {
  TempDir dir;
  auto job = StartMpi(dir, 3, Exact(int64_t{1} << 20));
  ExpectAllSucceed(*job, "exact OK", 3);
}

TEST(MpiJob, FourRanksExact) {
  TempDir dir;
  auto job = StartMpi(dir, 4, Exact(65539));
  ExpectAllSucceed(*job, "exact OK", 4);
}

// Without the shared memory segment (as across hosts), allreduces of DTRAIN_MPI_RING_BYTES or
// more go around dtrain's segmented ring over MPI point-to-point (mpi_ring.h); 1 sends every one
// there, of every dtype and reduction, up to 16 MB in 60 KiB segments (several windows of them).
void ExpectRingExact(int n, int64_t max_elements) {
  TempDir dir;
  auto job =
      StartMpi(dir, n, Exact(max_elements),
               {{"DTRAIN_GLOO_SHM", "0"}, {"DTRAIN_MPI_RING_BYTES", "1"}, {"PS_VERBOSE", "1"}});
  ExpectAllSucceed(*job, "exact OK", n);
  const std::string out = job->Output();
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(out.find("rank " + std::to_string(r) +
                       " sends allreduces of 1 bytes or more around "
                       "dtrain's ring over MPI"),
              std::string::npos)
        << out;
  }
}

TEST(MpiJob, TwoRanksExactAroundDtrainsRing) { ExpectRingExact(2, int64_t{1} << 22); }
TEST(MpiJob, ThreeRanksExactAroundDtrainsRing) { ExpectRingExact(3, int64_t{1} << 20); }
TEST(MpiJob, FourRanksExactAroundDtrainsRing) { ExpectRingExact(4, 65539); }

// --- fusion and compression --------------------------------------------------------------------

// "fusion OK: tensors=100 data_calls=N": 100 allreduces submitted together must share calls. A
// 20 ms cycle lets every rank submit all of them before the next round on any normal machine.
void ExpectFused(Job& job, int n) {
  ExpectAllSucceed(job, "fusion OK", n);
  std::smatch m;
  const std::string out = job.Output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("data_calls=(\\d+)"))) << out;
  EXPECT_LE(std::stoi(m[1]), 10) << out;
}

TEST(GlooJob, HundredSmallAllreducesAreFused) {
  TempDir dir;
  auto job = StartGloo(dir, 2, {"--scenario", "fusion"}, {{"DTRAIN_CYCLE_TIME_MS", "20"}});
  ExpectFused(*job, 2);
}

TEST(MpiJob, HundredSmallAllreducesAreFused) {
  TempDir dir;
  auto job = StartMpi(dir, 2, {"--scenario", "fusion"}, {{"DTRAIN_CYCLE_TIME_MS", "20"}});
  ExpectFused(*job, 2);
}

TEST(GlooJob, Fp16CompressionIsApproximatelyRight) {
  TempDir dir;
  auto job = StartGloo(dir, 3, {"--scenario", "fp16"}, {{"DTRAIN_FP16_ALLREDUCE", "1"}});
  ExpectAllSucceed(*job, "fp16 OK", 3);
}

TEST(MpiJob, Fp16CompressionIsApproximatelyRight) {
  TempDir dir;
  auto job = StartMpi(dir, 2, {"--scenario", "fp16"}, {{"DTRAIN_FP16_ALLREDUCE", "1"}});
  ExpectAllSucceed(*job, "fp16 OK", 2);
}

// --- failures ----------------------------------------------------------------------------------

// Waits for rank `rank`'s pid file and for `after` in the job's output, then sends that rank
// `signal` (SIGKILL: it dies; SIGSTOP: it freezes, its sockets still open).
void KillRankMidJob(const TempDir& dir, int rank, const Job& job,
                    const std::string& after = "step 100", int signal = SIGKILL) {
  const std::string pid_file = dir.path() + "/rank" + std::to_string(rank) + ".pid";
  for (int i = 0; i < 6000; ++i) {
    std::ifstream in(pid_file);
    int pid = 0;
    if (in >> pid && pid > 0 && job.Output().find(after) != std::string::npos) {
      kill(pid, signal);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "the job never got going:\n" << job.Output();
}

// Each failure test runs over shared memory (the default on one host) and over loopback TCP.
const std::vector<Env> kBothPaths = {{}, {{"DTRAIN_GLOO_SHM", "0"}}};

TEST(GlooJob, ARankThatDiesFailsTheOthersNamingIt) {
  for (const Env& env : kBothPaths) {
    SCOPED_TRACE(env.empty() ? "shared memory" : "loopback TCP");
    TempDir dir;
    auto job = StartGloo(dir, 3, {"--scenario", "die", "--pid-dir", dir.path()}, env);
    KillRankMidJob(dir, 1, *job);
    const auto codes = job->Wait();
    const std::string out = job->Output();
    EXPECT_EQ(codes[1], 128 + SIGKILL) << out;
    for (int r : {0, 2}) {
      EXPECT_EQ(codes[r], 3) << "rank " << r << " should fail with a peer error:\n" << out;
      EXPECT_NE(job->processes[r]->Output().find("rank 1 ("), std::string::npos) << out;
      EXPECT_NE(job->processes[r]->Output().find("left the job"), std::string::npos) << out;
    }
  }
}

// A frozen rank (SIGSTOP) keeps its connections open, so only its silence shows: the others fail
// naming it once it has been silent for PS_HEARTBEAT_TIMEOUT, not at the collective timeout.
TEST(GlooJob, AFrozenRankFailsTheOthersNamingItAfterTheHeartbeatTimeout) {
  for (const Env& base : kBothPaths) {
    SCOPED_TRACE(base.empty() ? "shared memory" : "loopback TCP");
    Env env = base;
    env["PS_HEARTBEAT_TIMEOUT"] = "2000";
    env["DTRAIN_COLLECTIVE_TIMEOUT_MS"] = "120000";  // far beyond the hang guard's wait below
    TempDir dir;
    auto job = StartGloo(dir, 3, {"--scenario", "die", "--pid-dir", dir.path()}, env);
    KillRankMidJob(dir, 1, *job, "step 100", SIGSTOP);
    for (int r : {0, 2}) {
      const auto code = job->processes[r]->Wait(60000);
      ASSERT_TRUE(code.has_value()) << "rank " << r << " still waits:\n" << job->Output();
      EXPECT_EQ(*code, 3) << "rank " << r << " should fail with a peer error:\n" << job->Output();
      const std::string out = job->processes[r]->Output();
      EXPECT_NE(out.find("rank 1 ("), std::string::npos) << job->Output();
      EXPECT_NE(out.find("sent nothing for"), std::string::npos) << job->Output();
    }
    job->processes[1]->Kill(SIGKILL);
  }
}

TEST(GlooJob, ARankDyingInTheMiddleOfALargeAllreduceIsNamed) {
  // 16 MB tensors: the kill usually lands while data is in flight, where gloo may leave a wait
  // hanging (the watchdog's case) and shared memory rounds wait on the dead rank.
  for (const Env& env : kBothPaths) {
    SCOPED_TRACE(env.empty() ? "shared memory" : "loopback TCP");
    TempDir dir;
    auto job = StartGloo(
        dir, 3, {"--scenario", "die", "--pid-dir", dir.path(), "--elements", "4194304"}, env);
    KillRankMidJob(dir, 2, *job, "step 3");
    const auto codes = job->Wait();
    for (int r : {0, 1}) {
      EXPECT_EQ(codes[r], 3) << job->Output();
      EXPECT_NE(job->processes[r]->Output().find("rank 2 ("), std::string::npos) << job->Output();
    }
  }
}

TEST(GlooJob, RankZeroDyingIsNamedToo) {
  for (const Env& env : kBothPaths) {
    SCOPED_TRACE(env.empty() ? "shared memory" : "loopback TCP");
    TempDir dir;
    auto job = StartGloo(dir, 2, {"--scenario", "die", "--pid-dir", dir.path()}, env);
    KillRankMidJob(dir, 0, *job);
    const auto codes = job->Wait();
    const std::string out = job->processes[1]->Output();
    EXPECT_EQ(codes[1], 3) << out;
    EXPECT_NE(out.find("rank 0 ("), std::string::npos) << out;
  }
}

TEST(MpiJob, ARankThatDiesEndsTheJobNamingIt) {
  TempDir dir;
  auto job = StartMpi(dir, 3, {"--scenario", "die", "--pid-dir", dir.path()});
  KillRankMidJob(dir, 1, *job);
  const auto codes = job->Wait();
  const std::string out = job->Output();
  EXPECT_NE(codes[0], 0) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
}

// The same while every allreduce goes around dtrain's ring (as across hosts): its waits are
// MPI's, and the job still ends, naming the rank.
TEST(MpiJob, ARankThatDiesAroundTheRingEndsTheJobNamingIt) {
  TempDir dir;
  auto job = StartMpi(dir, 3, {"--scenario", "die", "--pid-dir", dir.path()},
                      {{"DTRAIN_GLOO_SHM", "0"}, {"DTRAIN_MPI_RING_BYTES", "1"}});
  KillRankMidJob(dir, 1, *job);
  const auto codes = job->Wait();
  const std::string out = job->Output();
  EXPECT_NE(codes[0], 0) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
}

// A frozen rank (SIGSTOP) under MPI, without the shared memory segment (as across hosts): MPI's
// waits have no deadline, but the engine's has (DTRAIN_COLLECTIVE_TIMEOUT_MS), so the others
// fail their waits, leave the engine thread stuck in MPI, and mpirun ends the job, whether the
// allreduce was MPI's own or went around dtrain's ring.
TEST(MpiJob, AFrozenRankEndsTheJobAtTheCollectiveTimeout) {
  for (const char* ring_bytes : {"0", "1"}) {
    SCOPED_TRACE(std::string("DTRAIN_MPI_RING_BYTES=") + ring_bytes);
    TempDir dir;
    auto job = StartMpi(dir, 3, {"--scenario", "die", "--pid-dir", dir.path()},
                        {{"DTRAIN_GLOO_SHM", "0"},
                         {"DTRAIN_MPI_RING_BYTES", ring_bytes},
                         {"DTRAIN_COLLECTIVE_TIMEOUT_MS", "2000"}});
    KillRankMidJob(dir, 1, *job, "step 100", SIGSTOP);
    const auto code = job->processes[0]->Wait(90000);
    ASSERT_TRUE(code.has_value()) << "mpirun still waits:\n" << job->Output();
    EXPECT_NE(*code, 0) << job->Output();
    EXPECT_NE(job->Output().find("did not finish within 2 s"), std::string::npos) << job->Output();
  }
}

TEST(GlooJob, AStallIsReportedNamingTheMissingRankAndTensor) {
  TempDir dir;
  auto job = StartGloo(dir, 2, {"--scenario", "stall", "--late-rank", "1"},
                       {{"DTRAIN_STALL_WARNING_S", "1"}});
  ExpectAllSucceed(*job, "stall OK", 2);
  EXPECT_NE(job->processes[0]->Output().find("'stalled.tensor' waits for rank 1"),
            std::string::npos)
      << job->Output();
}

TEST(MpiJob, AStallIsReportedNamingTheMissingRankAndTensor) {
  TempDir dir;
  auto job = StartMpi(dir, 3, {"--scenario", "stall", "--late-rank", "2"},
                      {{"DTRAIN_STALL_WARNING_S", "1"}});
  ExpectAllSucceed(*job, "stall OK", 3);
  EXPECT_NE(job->Output().find("'stalled.tensor' waits for rank 2"), std::string::npos)
      << job->Output();
}

TEST(GlooJob, MismatchedShapesFailEveryRankClearly) {
  TempDir dir;
  auto job = StartGloo(dir, 3, {"--scenario", "mismatch"});
  const auto codes = job->Wait();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(codes[r], 3) << job->Output();
    EXPECT_NE(job->processes[r]->Output().find(
                  "rank 0 allreduce(sum) float32 (4,), rank 1 allreduce(sum) float32 (5,), "
                  "rank 2 allreduce(sum) float32 (6,)"),
              std::string::npos)
        << job->Output();
  }
}

TEST(GlooJob, WaitTimesOutNamingTheTensorAndTheMissingRank) {
  TempDir dir;
  auto job = StartGloo(dir, 2, {"--scenario", "timeout", "--late-rank", "1"},
                       {{"DTRAIN_COLLECTIVE_TIMEOUT_MS", "1500"}});
  const auto codes = job->Wait();
  const std::string out = job->processes[0]->Output();
  EXPECT_EQ(codes[0], 3) << out;
  EXPECT_NE(out.find("'never.complete' did not finish"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 had not submitted it"), std::string::npos) << out;
}

TEST(GlooJob, AMissingRankFailsTheRendezvousNamingIt) {
  TempDir dir;
  // Rank 0 of 3 alone (and rank 2, which is told the same): rank 1 never comes.
  auto job = StartGloo(dir, 3, {"--scenario", "exact"}, {{"DTRAIN_CONNECT_TIMEOUT_MS", "1500"}});
  job->processes[1]->Kill(SIGKILL);
  const auto codes = job->Wait();
  EXPECT_EQ(codes[0], 2) << job->Output();
  EXPECT_NE(job->processes[0]->Output().find("for rank 1 of 3"), std::string::npos)
      << job->Output();
}

TEST(GlooJob, NoRankZeroFailsTheRendezvousNamingHostAndPort) {
  TempDir dir;
  const int port = FreePort();
  Subprocess rank1({Check()},
                   {{"DTRAIN_COLLECTIVES", "gloo"},
                    {"DTRAIN_NODE_RANK", "1"},
                    {"DMLC_NUM_WORKER", "2"},
                    {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                    {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                    {"DTRAIN_CONNECT_TIMEOUT_MS", "500"}},
                   dir.path() + "/rank1.log");
  auto code = rank1.Wait(kHangGuardMs);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << rank1.Output();
  EXPECT_NE(rank1.Output().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << rank1.Output();
}

TEST(CollectivesJob, ABadVariableStopsTheProcessNamingIt) {
  TempDir dir;
  Subprocess p({Check()}, {{"DTRAIN_COLLECTIVES", "nccl"}}, dir.path() + "/p.log");
  auto code = p.Wait(kHangGuardMs);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << p.Output();
  EXPECT_NE(p.Output().find("DTRAIN_COLLECTIVES='nccl'"), std::string::npos) << p.Output();

  Subprocess q({Check()}, {{"DTRAIN_FUSION_THRESHOLD_MB", "big"}}, dir.path() + "/q.log");
  code = q.Wait(kHangGuardMs);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << q.Output();
  EXPECT_NE(q.Output().find("DTRAIN_FUSION_THRESHOLD_MB='big'"), std::string::npos) << q.Output();
}

}  // namespace
}  // namespace dtrain::testing

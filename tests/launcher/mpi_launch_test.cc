// `dtrain launch --launcher mpi` with the real mpirun of this machine (Open MPI), as users run it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>

#include "batch_test_support.h"
#include "launch_test_support.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Skips the test when mpirun is not installed (the missing-mpirun test runs anyway).
#define REQUIRE_MPIRUN()                                                                           \
  do {                                                                                             \
    if (!FindProgram("mpirun")) GTEST_SKIP() << "mpirun is not in PATH (apt install openmpi-bin)"; \
  } while (0)

std::vector<std::string> Mpi(std::vector<std::string> args) {
  args.insert(args.begin(), {"--launcher", "mpi", "--kill-grace-ms", "2000"});
  return args;
}

void ExpectNothingLeft(const LaunchProcess& launch) {
  // mpirun's tasks carry the job's variable too (-x): found wherever they are on this machine.
  EXPECT_TRUE(PollUntil([&] { return ProcessesWithEnv(launch.job_env()).empty(); },
                        std::chrono::seconds(10)))
      << ProcessesWithEnv(launch.job_env()).size() << " processes of the job survived";
}

TEST(MpiLaunch, TwoWorkersTwoServersSyncSucceed) {
  REQUIRE_MPIRUN();
  REQUIRE_KV_CHECK_WORKER(worker);
  LaunchProcess launch(
      Mpi({"-n", "2", "-s", "2", "--", worker, "--scenario", "sync", "--rounds", "5"}));
  LaunchResult r = launch.Wait(std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("dtrain launch: starting 1 scheduler here (at 127.0.0.1:"));
  EXPECT_THAT(r.err, HasSubstr("2 servers and 2 workers through mpirun on this machine"));
  EXPECT_THAT(r.out, TwoWorkersSynced());
  ExpectNothingLeft(launch);
}

TEST(MpiLaunch, AllreduceJobIsPlainMpirunWithOmpiRanks) {
  REQUIRE_MPIRUN();
  LaunchProcess launch(Mpi({"-n", "3", "-s", "0", "--env", "FOO:a,b c", "--", "sh", "-c",
                            "printf 'rank=%s ' $DTRAIN_NODE_RANK; sleep 0.2; "
                            "echo \"ompi=$OMPI_COMM_WORLD_RANK/$OMPI_COMM_WORLD_SIZE "
                            "n=$DMLC_NUM_WORKER s=$DMLC_NUM_SERVER "
                            "root=$DMLC_PS_ROOT_URI foo=$FOO\"; echo err >&2"}));
  LaunchResult r = launch.Wait(std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("starting 3 workers through mpirun on this machine (allreduce job"));
  for (int rank = 0; rank < 3; ++rank) {
    const std::string n = std::to_string(rank);
    // The line was written in two pieces: it still comes out whole, with its prefix.
    EXPECT_THAT(r.out, HasSubstr("[worker " + n + "] rank=" + n + " ompi=" + n +
                                 "/3 n=3 s=0 root=127.0.0.1 foo=a,b c\n"));
    EXPECT_THAT(r.err, HasSubstr("[worker " + n + "] err\n"));
  }
  for (const std::string& line : SplitLines(r.out)) {
    EXPECT_EQ(line.rfind("[worker ", 0), 0u) << "unprefixed line: " << line;
  }
  ExpectNothingLeft(launch);
}

TEST(MpiLaunch, FailingWorkerIsNamedWithItsExitCode) {
  REQUIRE_MPIRUN();
  LaunchProcess launch(Mpi({"-n", "3", "-s", "0", "--", "sh", "-c",
                            "if [ \"$DTRAIN_NODE_RANK\" = 1 ]; then echo giving up >&2; exit 3; "
                            "fi; exec sleep 1000"}));
  LaunchResult r = launch.Wait(std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("[worker 1] giving up\n"));
  EXPECT_THAT(r.err, HasSubstr("\ndtrain launch: worker 1 exited with code 3 (reported by "
                               "mpirun); stopping the job\n"));
  ExpectNothingLeft(launch);
}

TEST(MpiLaunch, DyingWorkerOfAParameterServerJobIsNamed) {
  REQUIRE_MPIRUN();
  REQUIRE_KV_CHECK_WORKER(worker);
  LaunchProcess launch(Mpi({"-n", "3", "-s", "2", "--", worker, "--scenario", "die", "--die-rank",
                            "2", "--die-after", "4"}));
  LaunchResult r = launch.Wait(std::chrono::seconds(120));
  EXPECT_NE(r.exit_code, 0) << r.err;
  // Every process fails after it; the scheduler's account names the one that failed first, and
  // mpirun's report adds its exit code (9) when mpirun reports that task.
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(\ndtrain launch: worker 2 (exited with code 9 \(reported by mpirun\))"
                        R"(|failed: .* \(reported by the scheduler\)); stopping the job\n)")))
      << r.err;
  EXPECT_THAT(r.err, CauseReportedByScheduler("worker 2"));
  ExpectNothingLeft(launch);
}

TEST(MpiLaunch, HostfileSlotsAreHonoured) {
  REQUIRE_MPIRUN();
  TempDir dir;
  std::ofstream(dir / "hosts") << "# one machine, two slots\nlocalhost:2\n";
  LaunchResult fits = RunLaunch(Mpi(
      {"-H", dir / "hosts", "-n", "2", "-s", "0", "--", "sh", "-c", "echo on $DMLC_PS_ROOT_URI"}));
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_THAT(fits.out, HasSubstr("[worker 1] on 127.0.0.1\n"));
  LaunchResult too_many = RunLaunch(Mpi({"-H", dir / "hosts", "-n", "3", "-s", "0", "--", "true"}));
  EXPECT_NE(too_many.exit_code, 0);
  EXPECT_THAT(too_many.err, HasSubstr("[mpirun workers] There are not enough slots available"));
  EXPECT_TRUE(std::regex_search(
      too_many.err, std::regex(R"(dtrain launch: mpirun \(workers, pid \d+\) exited with code)")))
      << too_many.err;
}

TEST(MpiLaunch, InterruptStopsEverything) {
  REQUIRE_MPIRUN();
  TempDir tmp;
  const std::string pids = tmp / "pids";
  // The workers ignore SIGTERM: mpirun, then the launcher's SIGKILL, must end them.
  LaunchProcess launch(Mpi({"-n", "2", "-s", "1", "--", "sh", "-c",
                            "trap '' TERM; sleep 1000 & echo $! >> " + pids + "; wait"}));
  ASSERT_TRUE(PollUntil([&] { return ReadPids(pids).size() == 2; }, std::chrono::seconds(60)))
      << "the job did not start";
  launch.Signal(SIGINT);
  LaunchResult r = launch.Wait(std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_THAT(r.err, HasSubstr("dtrain launch: interrupted; stopping the job\n"));
  ExpectNothingLeft(launch);
  for (pid_t p : ReadPids(pids)) EXPECT_FALSE(IsRunning(p)) << "pid " << p << " survived";
}

TEST(MpiLaunch, MissingMpirunIsAClearUsageError) {
  ExpectMissingProgramIsAUsageError("mpi", "mpirun");
}

}  // namespace
}  // namespace dtrain::launcher::testing

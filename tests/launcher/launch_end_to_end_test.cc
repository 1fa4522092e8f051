// `dtrain launch` as users run it: the real binary, real processes, shell snippets as workers.
//
// The scheduler and servers are the dtrain binary's own. Shell snippets never join a
// parameter-server job, so the tests about output and processes run them as allreduce jobs (-s 0)
// or expect the launch to fail for that.
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
using ::testing::IsEmpty;
using ::testing::Not;

// The port of the "(scheduler at 127.0.0.1:PORT)" start line; -1 when there is none.
int AnnouncedPort(const std::string& err) {
  std::smatch m;
  static const std::regex start(
      R"(dtrain launch: starting 1 scheduler, \d+ servers?, \d+ workers? on this machine )"
      R"(\(scheduler at 127\.0\.0\.1:(\d+)\))");
  if (!std::regex_search(err, m, start)) return -1;
  return std::stoi(m[1]);
}

void ExpectNothingLeft(const LaunchProcess& launch, const std::vector<pid_t>& pids) {
  EXPECT_THAT(ProcessesWithEnv(launch.job_env()), IsEmpty()) << "processes of the job survived";
  for (pid_t pid : pids) EXPECT_FALSE(IsRunning(pid)) << "pid " << pid << " survived the job";
}

TEST(LaunchEndToEnd, PrefixesOutputAndPassesTheJobEnvironment) {
  LaunchProcess launch(
      {"-n", "2", "-s", "1", "--env", "FOO:bar=baz", "--env", "PASS_ME", "--env-worker",
       "ONLY_WORKERS:w", "--env-server", "ONLY_SERVERS:s", "--", "sh", "-c",
       R"(echo "role=$DMLC_ROLE rank=$DTRAIN_NODE_RANK workers=$DMLC_NUM_WORKER )"
       R"(servers=$DMLC_NUM_SERVER uri=$DMLC_PS_ROOT_URI port=$DMLC_PS_ROOT_PORT )"
       R"(host=$DMLC_NODE_HOST foo=$FOO pass=$PASS_ME w=$ONLY_WORKERS s=$ONLY_SERVERS";)"
       R"(echo "on stderr $DTRAIN_NODE_RANK" >&2;)"
       R"(if [ "$DTRAIN_NODE_RANK" = 1 ]; then sleep 0.3; echo late; fi)"},
      {"PASS_ME=from the launcher"});
  LaunchResult r = launch.Wait();
  // The shell workers never join the job (WorkersThatNeverJoinTheJobFailItNamingThem).
  ASSERT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("without joining the job"));

  const int port = AnnouncedPort(r.err);
  ASSERT_GT(port, 0) << r.err;
  ASSERT_LT(port, 65536);
  for (int rank : {0, 1}) {
    const std::string prefix = "[worker " + std::to_string(rank) + "] ";
    EXPECT_THAT(r.out, HasSubstr(prefix + "role=worker rank=" + std::to_string(rank) +
                                 " workers=2 servers=1 uri=127.0.0.1 port=" + std::to_string(port) +
                                 " host=127.0.0.1 foo=bar=baz pass=from the launcher w=w s=\n"));
    EXPECT_THAT(r.err, HasSubstr(prefix + "on stderr " + std::to_string(rank) + "\n"));
  }
  // Worker 0 exiting first does not end the job.
  EXPECT_THAT(r.out, HasSubstr("[worker 1] late\n"));
  for (const std::string& line : SplitLines(r.out)) {
    EXPECT_TRUE(line.rfind("[worker ", 0) == 0 || line.rfind("[server ", 0) == 0 ||
                line.rfind("[scheduler] ", 0) == 0)
        << "unprefixed line: " << line;
  }
  ExpectNothingLeft(launch, {});
}

TEST(LaunchEndToEnd, LinesOfManyWorkersNeverMix) {
  // Each line is written in two pieces, so the launcher has to put it back together.
  constexpr int kLines = 1000;
  LaunchResult r = RunLaunch(
      {"-n", "4", "-s", "0", "--", "sh", "-c",
       "i=0; while [ $i -lt " + std::to_string(kLines) +
           " ]; do printf 'w%s-%s-' $DTRAIN_NODE_RANK $i; printf '%0150d\\n' 0; i=$((i+1)); "
           "done"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex line_re(R"(\[worker (\d)\] w(\d)-(\d+)-0{150})");
  std::vector<int> next(4, 0);
  for (const std::string& line : SplitLines(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "mixed or broken line: " << line;
    ASSERT_EQ(m[1], m[2]) << line;
    const int rank = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[3]), next[rank]++) << "lines of worker " << rank << " out of order";
  }
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(next[rank], kLines) << "worker " << rank;
}

TEST(LaunchEndToEnd, VeryLongLinesComeInPiecesAndAPartialLastLineIsEnded) {
  LaunchResult r = RunLaunch({"-n", "1", "-s", "0", "--", "sh", "-c",
                              "head -c 150000 /dev/zero | tr '\\0' a; printf 'tail'"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = SplitLines(r.out);
  const std::string prefix = "[worker 0] ";
  // 150000 + 4 bytes without a newline: two 64 KiB pieces, then the rest at EOF.
  ASSERT_EQ(lines.size(), 3u) << r.out.substr(0, 200);
  EXPECT_EQ(lines[0], prefix + std::string(65536, 'a'));
  EXPECT_EQ(lines[1], prefix + std::string(65536, 'a'));
  EXPECT_EQ(lines[2], prefix + std::string(150000 - 2 * 65536, 'a') + "tail");
  EXPECT_EQ(r.out.back(), '\n');
}

TEST(LaunchEndToEnd, QuotedCommandRunsInAShell) {
  LaunchResult r =
      RunLaunch({"-n", "2", "-s", "0", "echo quoted $DTRAIN_NODE_RANK && echo second line"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("[worker 0] quoted 0\n"), HasSubstr("[worker 1] quoted 1\n"),
                           HasSubstr("[worker 1] second line\n")));
}

TEST(LaunchEndToEnd, CommandWithoutDoubleDashKeepsItsOwnFlags) {
  // As in the seeds: `launch.py -n 2 --launcher local python train.py --kvstore dist_sync`.
  LaunchResult r = RunLaunch({"-n", "1", "--launcher", "local", "-s", "0", "sh", "-c",
                              "echo \"args: $*\"", "sh", "--kvstore", "dist_sync", "-n", "7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[worker 0] args: --kvstore dist_sync -n 7\n"));
}

TEST(LaunchEndToEnd, FailingWorkerStopsTheJobWithItsExitCode) {
  TempDir tmp;
  const std::string pids = tmp / "pids";
  // Every worker leaves a grandchild behind; worker 1 fails once all three have started.
  LaunchProcess launch({"-n", "3", "-s", "2", "--kill-grace-ms", "1000", "--", "sh", "-c",
                        "sleep 1000 & echo $$ $! >> " + pids +
                            "; if [ \"$DTRAIN_NODE_RANK\" = 1 ]; then "
                            "while [ \"$(wc -l < " +
                            pids +
                            ")\" -lt 3 ]; do sleep 0.05; done; "
                            "echo giving up >&2; exit 3; fi; wait"});
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("[worker 1] giving up\n"));
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(\ndtrain launch: worker 1 \(pid \d+\) exited with code 3; )"
                        R"(stopping the job\n)")))
      << r.err;
  // The failure is reported after the worker's last words, and only once.
  EXPECT_LT(r.err.find("giving up"), r.err.find("stopping the job"));
  EXPECT_EQ(r.err.find("stopping the job"), r.err.rfind("stopping the job"));
  std::vector<pid_t> started = ReadPids(pids);
  EXPECT_EQ(started.size(), 6u);
  ExpectNothingLeft(launch, started);
}

TEST(LaunchEndToEnd, WorkerKilledBySignalIsNamed) {
  LaunchProcess launch({"-n", "2", "--kill-grace-ms", "1000", "--", "sh", "-c",
                        "if [ \"$DTRAIN_NODE_RANK\" = 0 ]; then kill -9 $$; fi; sleep 1000"});
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(dtrain launch: worker 0 \(pid \d+\) was killed by signal 9 )"
                        R"(\(SIGKILL\); stopping the job)")))
      << r.err;
  ExpectNothingLeft(launch, {});
}

TEST(LaunchEndToEnd, DyingWorkerIsNamedByTheSchedulersReport) {
  REQUIRE_KV_CHECK_WORKER(worker);
  LaunchProcess launch({"-n", "3", "-s", "2", "--kill-grace-ms", "1000", "--", worker, "--scenario",
                        "die", "--die-rank", "2", "--die-after", "4"});
  LaunchResult r = launch.Wait(std::chrono::seconds(120));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, CauseReportedByScheduler("worker 2")) << r.err;
  ExpectNothingLeft(launch, {});
}

TEST(LaunchEndToEnd, FailingServerStopsTheJob) {
  // An out-of-range variable makes `dtrain server` exit 1 at start; the workers would run on.
  LaunchProcess launch({"-n", "2", "-s", "1", "--env-server", "PS_VERBOSE:7", "--kill-grace-ms",
                        "1000", "--", "sleep", "1000"});
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(dtrain launch: server 0 \(pid \d+\) exited with code 1; stopping)")))
      << r.err;
  EXPECT_THAT(r.err, HasSubstr("[server 0] "));
  ExpectNothingLeft(launch, {});
}

TEST(LaunchEndToEnd, MissingProgramExitsLikeAShell) {
  LaunchProcess launch({"-n", "1", "--", "dtrain-no-such-program-x"});
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_THAT(r.err, HasSubstr("[worker 0] dtrain launch: cannot run 'dtrain-no-such-program-x'"));
  ExpectNothingLeft(launch, {});
}

TEST(LaunchEndToEnd, StartFailureStopsWhatWasAlreadyStarted) {
  // Two pipes per process do not fit in 40 descriptors: some process cannot be started.
  LaunchProcess launch({"-n", "30", "-s", "1", "--kill-grace-ms", "1000", "--", "sleep", "1000"},
                       {}, "ulimit -n 40");
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(dtrain launch: cannot start worker \d+: pipe: .*; stopping the job)")))
      << r.err;
  ExpectNothingLeft(launch, {});
}

// Workers that exit 0 without ever joining (no dist kvstore) leave the scheduler waiting for
// their registrations: the job did nothing, and fails at once naming them.
TEST(LaunchEndToEnd, WorkersThatNeverJoinTheJobFailItNamingThem) {
  LaunchProcess launch({"-n", "2", "-s", "2", "--", "true"});
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("dtrain launch: worker 0 (pid "));
  EXPECT_THAT(r.err, HasSubstr(") and worker 1 (pid "));
  EXPECT_THAT(r.err, HasSubstr("exited with code 0 without joining the job"));
  EXPECT_THAT(r.err, Not(HasSubstr("ms after the workers finished")));
  ExpectNothingLeft(launch, {});
}

class LaunchInterrupted : public ::testing::TestWithParam<int> {};

TEST_P(LaunchInterrupted, StopsEverythingAndExitsWith128PlusSignal) {
  const int sig = GetParam();
  TempDir tmp;
  const std::string pids = tmp / "pids";
  // The workers ignore SIGTERM (so do their grandchildren): only SIGKILL after the grace ends them.
  LaunchProcess launch({"-n", "2", "-s", "2", "--kill-grace-ms", "300", "--", "sh", "-c",
                        "trap '' TERM; sleep 1000 & echo $$ $! >> " + pids + "; wait"});
  // 1 scheduler + 2 servers + 2 workers + 2 grandchildren, all found by their variable: this also
  // shows that ExpectNothingLeft below looks at the right processes.
  ASSERT_TRUE(PollUntil(
      [&] { return ReadPids(pids).size() == 4 && ProcessesWithEnv(launch.job_env()).size() >= 7; },
      std::chrono::seconds(30)))
      << "the job did not start";
  launch.Signal(sig);
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
  EXPECT_THAT(r.err, HasSubstr("dtrain launch: interrupted; stopping the job\n"));
  EXPECT_THAT(r.err, Not(HasSubstr("exited with code")));
  ExpectNothingLeft(launch, ReadPids(pids));
}

INSTANTIATE_TEST_SUITE_P(Signals, LaunchInterrupted, ::testing::Values(SIGINT, SIGTERM),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

TEST(LaunchEndToEnd, ChildrenDieWithAKilledLauncher) {
  // The workers are direct children (no shell), as the scheduler and servers are.
  LaunchProcess launch({"-n", "2", "-s", "2", "--", "sleep", "1000"});
  ASSERT_TRUE(PollUntil([&] { return ProcessesWithEnv(launch.job_env()).size() == 5; },
                        std::chrono::seconds(30)))
      << "the job did not start";
  launch.Signal(SIGKILL);
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  // PR_SET_PDEATHSIG: the kernel kills them, asynchronously; the poll is only a hang guard.
  EXPECT_TRUE(PollUntil([&] { return ProcessesWithEnv(launch.job_env()).empty(); },
                        std::chrono::seconds(30)))
      << ProcessesWithEnv(launch.job_env()).size() << " orphans left";
}

TEST(LaunchEndToEnd, AnEscapedGrandchildHoldingThePipesDoesNotHoldTheLauncher) {
  // setsid leaves the job's process group, so the launcher cannot stop it, and the sleep keeps
  // the worker's pipes open: the launcher must give up on them rather than wait for EOF.
  LaunchProcess launch(
      {"-n", "1", "-s", "0", "--", "sh", "-c", "setsid sleep 1000 & echo started"});
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[worker 0] started\n"));
  // The destructor of `launch` kills the escaped sleep.
}

TEST(LaunchEndToEnd, OutputDirGetsOneUnprefixedLogPerProcess) {
  TempDir tmp;
  const std::string dir = tmp / "logs/nested";
  LaunchResult r = RunLaunch({"-n", "2", "-s", "1", "--output-dir", dir, "--", "sh", "-c",
                              "echo out-$DTRAIN_NODE_RANK; echo err-$DTRAIN_NODE_RANK >&2"});
  // The shell workers never join the job (WorkersThatNeverJoinTheJobFailItNamingThem).
  ASSERT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("without joining the job"));
  for (int rank : {0, 1}) {
    const std::string log = ReadFile(dir + "/worker-" + std::to_string(rank) + ".log");
    const std::string n = std::to_string(rank);
    EXPECT_THAT(log, AllOf(HasSubstr("out-" + n + "\n"), HasSubstr("err-" + n + "\n"),
                           Not(HasSubstr("[worker"))));
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/scheduler.log"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/server-0.log"));
  // The terminal still gets everything, prefixed.
  EXPECT_THAT(r.out, HasSubstr("[worker 1] out-1\n"));
}

TEST(LaunchEndToEnd, HelpExitsZeroAndStartsNothing) {
  LaunchResult r = RunLaunch({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("--num-workers"), HasSubstr("--env-worker"),
                           HasSubstr("--kill-grace-ms")));
  EXPECT_THAT(r.err, Not(HasSubstr("starting 1 scheduler")));
}

TEST(LaunchEndToEnd, ACommandNamedLikeADtrainSubcommandIsStillTheCommand) {
  LaunchResult r = RunLaunch({"-n", "1", "--", "server"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_THAT(r.err, HasSubstr("[worker 0] dtrain launch: cannot run 'server'"));
}

TEST(LaunchEndToEnd, AnEmptyOrShortSecretIsRefusedBeforeAnythingStarts) {
  for (const std::string secret : {"", "too-short"}) {
    LaunchResult r =
        LaunchProcess({"-n", "1", "-s", "1", "--", "true"}, {"DTRAIN_JOB_SECRET=" + secret}).Wait();
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr(secret.empty() ? "DTRAIN_JOB_SECRET is set but empty"
                                                : "DTRAIN_JOB_SECRET is too short (9"));
    EXPECT_THAT(r.err, Not(HasSubstr("starting 1 scheduler")));
  }
}

struct BadArgs {
  std::string name;
  std::vector<std::string> args;
  std::string message;

  friend void PrintTo(const BadArgs& b, std::ostream* os) { *os << b.name; }
};

class LaunchBadArguments : public ::testing::TestWithParam<BadArgs> {};

TEST_P(LaunchBadArguments, ExitWithTwoAndSayWhy) {
  LaunchProcess launch(GetParam().args);
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(GetParam().message));
  EXPECT_THAT(r.err, Not(HasSubstr("starting 1 scheduler")));  // nothing was started
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LaunchBadArguments,
    ::testing::Values(
        BadArgs{"ZeroWorkers", {"-n", "0", "--", "true"}, "-n/--num-workers must be between 1"},
        BadArgs{"NoWorkerCount", {"--", "true"}, "--num-workers is required"},
        BadArgs{"NotANumber", {"-n", "two", "--", "true"}, "--num-workers"},
        BadArgs{"NoCommand", {"-n", "2"}, "no command given"},
        BadArgs{"NoCommandAfterDashes", {"-n", "2", "--"}, "no command given"},
        BadArgs{"UnknownLauncher",
                {"-n", "2", "--launcher", "yarn", "true"},
                "unknown launcher 'yarn'"},
        BadArgs{"SshWithoutHostfile",
                {"-n", "2", "--launcher", "ssh", "true"},
                "--launcher ssh needs -H/--hostfile"},
        BadArgs{"SyncDstDirIsForSsh",
                {"-n", "1", "--sync-dst-dir", "/tmp/x", "true"},
                "--sync-dst-dir needs --launcher ssh"},
        BadArgs{"HostfileIsNotForLocal",
                {"-n", "1", "-H", "/tmp/hosts", "true"},
                "-H/--hostfile does not apply to --launcher local"},
        BadArgs{"SshMissingHostfile",
                {"-n", "2", "--launcher", "ssh", "-H", "/nonexistent/hosts", "true"},
                "-H/--hostfile /nonexistent/hosts: cannot read it"},
        BadArgs{
            "UnknownOption", {"-n", "2", "--frobnicate", "true"}, "unknown option '--frobnicate'"},
        BadArgs{"UnsetPassThrough",
                {"-n", "1", "--env", "DTRAIN_SURELY_UNSET_VAR", "true"},
                "DTRAIN_SURELY_UNSET_VAR is not set in the launcher's environment"},
        BadArgs{"ReservedVariable",
                {"-n", "1", "--env", "DMLC_ROLE:worker", "true"},
                "the launcher sets DMLC_ROLE itself"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dtrain::launcher::testing

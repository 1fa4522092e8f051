// `dtrain launch --launcher ssh --max-restarts N` against real sshds, one per network namespace
// (ssh_test_cluster.h): a worker and then a server killed on their hosts are replaced there and
// every round of the kv_check_worker soak stays exact; a worker whose whole host fails (its sshd
// and processes killed) is replaced on the next host of the hostfile.
//
// Skipped, with the reason, where namespaces cannot be made.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <regex>
#include <sstream>

#include "launch_test_support.h"
#include "ssh_test_cluster.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string KvCheckWorker() { return DTRAIN_BINARY_DIR "/tests/programs/kv_check_worker"; }

class SshRestart : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::optional<std::string> why = SshTestCluster::WhyUnavailable()) {
      GTEST_SKIP() << "no ssh test cluster here: " << *why;
    }
    cluster_ = std::make_unique<SshTestCluster>(3);
  }

  // A 2x2 job under --max-restarts 2 over ssh on `hostfile`, kv_check_worker's sync soak with
  // `worker_args`.
  std::vector<std::string> Job(const std::string& hostfile,
                               std::vector<std::string> worker_args) const {
    std::vector<std::string> args = {"--launcher",
                                     "ssh",
                                     "-H",
                                     hostfile,
                                     "--ssh-opts",
                                     cluster_->ssh_opts(),
                                     "--kill-grace-ms",
                                     "1000",
                                     "-n",
                                     "2",
                                     "-s",
                                     "2",
                                     "--max-restarts",
                                     "2",
                                     "--",
                                     KvCheckWorker(),
                                     "--scenario",
                                     "sync"};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    return args;
  }

  std::unique_ptr<SshTestCluster> cluster_;
};

// Worker 1 kills itself half-way through round 5, and server 1 is killed 150 ms later (both on
// host 1): each is replaced on its host, the server from its checkpoint, and every pull of every
// round is the exact sum.
TEST_F(SshRestart, AWorkerAndThenAServerKilledOnTheirHostsAreReplacedThereAndStayExact) {
  LaunchProcess launch(Job(cluster_->WriteHostfile(2),
                           {"--rounds", "12", "--round-pause-ms", "20", "--kill-at-round", "5",
                            "--die-rank", "1", "--then-kill-server", "1"}));
  LaunchResult r = launch.Wait(std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string all = r.out + r.err;
  const std::string a1 = cluster_->address(1);
  EXPECT_THAT(all, HasSubstr("[worker 1] rank 1 kills itself half-way through round 5"));
  EXPECT_TRUE(std::regex_search(
      r.err,
      std::regex("dtrain launch: worker 1 on " + a1 +
                 R"( \(ssh pid \d+\) exited with code 137: the remote process was killed )"
                 R"(by signal 9 \(SIGKILL\); starting a replacement with its rank \(restart)")))
      << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("dtrain launch: server 1 on " + a1 +
                        R"( \(ssh pid \d+\) .*; starting a replacement with its rank \(restart)")))
      << r.err;
  // The replacement knew it was one (DTRAIN_RESTART_COUNT reached it through ssh): it resumed.
  EXPECT_THAT(all, HasSubstr("[worker 1] rank 1 replaces a lost worker: resuming at round 5"));
  EXPECT_THAT(all, HasSubstr("/server-1 at rounds"));
  EXPECT_THAT(all, HasSubstr("[worker 0] sync OK: rank 0 of 2, 12 rounds"));
  EXPECT_THAT(all, HasSubstr("[worker 1] sync OK: rank 1 of 2, 12 rounds"));
  EXPECT_THAT(all, Not(HasSubstr("CHECK FAILED")));
}

// Three hosts: servers on hosts 0 and 1, worker 0 on host 2, worker 1 on host 0. Host 2 fails
// (its sshd and every process there killed): worker 0's ssh client ends with 255, and its
// replacement runs on host 0, the next host of the hostfile, where the job goes on exact.
TEST_F(SshRestart, AWorkerWhoseHostFailsIsReplacedOnTheNextHostOfTheHostfile) {
  TempDir dir;
  const std::string pid_file = dir / "worker-0";
  std::vector<std::string> args = Job(cluster_->WriteHostfile(3), {});
  // Each worker first writes its pid (worker 0's first process: the one on host 2).
  args.resize(args.size() - 3);
  for (const std::string& a :
       {std::string("sh"), std::string("-c"),
        "[ \"$DTRAIN_NODE_RANK\" = 0 ] && [ -z \"$DTRAIN_RESTART_COUNT\" ] && echo $$ > " +
            pid_file + "; exec \"$0\" --scenario sync --rounds 150 --round-pause-ms 30",
        KvCheckWorker()}) {
    args.push_back(a);
  }
  LaunchProcess launch(args);
  ASSERT_TRUE(PollUntil([&] { return ReadPids(pid_file).size() == 1; }, std::chrono::seconds(30)))
      << "worker 0 never started";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // rounds under way
  const std::vector<pid_t> host2 = cluster_->PidsOn(2);
  ASSERT_FALSE(host2.empty());
  for (pid_t p : host2) ::kill(p, SIGKILL);

  LaunchResult r = launch.Wait(std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string all = r.out + r.err;
  const std::string a0 = cluster_->address(0), a2 = cluster_->address(2);
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("dtrain launch: worker 0 on " + a2 +
                        R"( \(ssh pid \d+\) exited with code 255 \(ssh itself failed[^)]*\); )"
                        "starting a replacement with its rank on " +
                        a0 + ", the next host of the hostfile \\(ssh to " + a2 + " failed\\)")))
      << r.err;
  EXPECT_THAT(all, HasSubstr("[worker 0] rank 0 replaces a lost worker: resuming at round"));
  EXPECT_THAT(all, HasSubstr("[worker 0] sync OK: rank 0 of 2, 150 rounds"));
  EXPECT_THAT(all, HasSubstr("[worker 1] sync OK: rank 1 of 2, 150 rounds"));
  EXPECT_THAT(all, Not(HasSubstr("CHECK FAILED")));
}

// Three hosts as above; host 2 (worker 0's) is cut off for 20 s, its processes alive. The
// scheduler loses worker 0 by its heartbeats (3 s here) and the launcher kills its ssh client; the
// replacement's ssh to host 2 times out, and with one restart in all it still moves on to host 0
// (the same restart, not a second one), where the job goes on exact. Before issue 63's link cuts
// the scheduler failed the job on the silence, and a replacement's failed ssh spent a restart.
TEST_F(SshRestart, AWorkerWhoseHostIsCutOffIsReplacedOnTheNextHostWithinOneRestart) {
  std::vector<std::string> args = Job(cluster_->WriteHostfile(3), {});
  args.resize(args.size() - 3);  // the job's command, without kv_check_worker's arguments
  args[std::find(args.begin(), args.end(), "--max-restarts") - args.begin() + 1] = "1";
  args[std::find(args.begin(), args.end(), "--ssh-opts") - args.begin() + 1] +=
      " -o ConnectTimeout=3";
  for (const char* a :
       {"--env", "PS_HEARTBEAT_INTERVAL:300", "--env", "PS_HEARTBEAT_TIMEOUT:3000"}) {
    args.insert(args.end() - 1, a);
  }
  args.push_back(KvCheckWorker());
  for (const char* a : {"--scenario", "sync", "--rounds", "150", "--round-pause-ms", "30"}) {
    args.push_back(a);
  }
  LaunchProcess launch(args);
  ASSERT_TRUE(PollUntil([&] { return !cluster_->PidsOn(2).empty(); }, std::chrono::seconds(30)))
      << "nothing started on host 2";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // rounds under way
  const std::vector<std::string> link = {"ip", "link", "set", cluster_->interface_name()};
  auto with = [&](const char* state) {
    std::vector<std::string> argv = link;
    argv.push_back(state);
    return argv;
  };
  ASSERT_EQ(cluster_->RunIn(2, with("down")), 0);
  std::this_thread::sleep_for(std::chrono::seconds(20));
  ASSERT_EQ(cluster_->RunIn(2, with("up")), 0);

  LaunchResult r = launch.Wait(std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string all = r.out + r.err;
  const std::string a0 = cluster_->address(0), a2 = cluster_->address(2);
  EXPECT_THAT(all, HasSubstr("was lost: sent no heartbeat for 3000 ms"));
  EXPECT_THAT(r.err, HasSubstr("dtrain launch: the scheduler lost worker 0 on " + a2));
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("starting a replacement with its rank on " + a0 +
                        ", the next host of the hostfile \\(ssh to " + a2 +
                        " failed\\) \\(restart 1 of 1, --max-restarts, the same restart on "
                        "another host\\)")))
      << r.err;
  EXPECT_THAT(all, HasSubstr("[worker 0] rank 0 replaces a lost worker: resuming at round"));
  EXPECT_THAT(all, HasSubstr("[worker 0] sync OK: rank 0 of 2, 150 rounds"));
  EXPECT_THAT(all, HasSubstr("[worker 1] sync OK: rank 1 of 2, 150 rounds"));
  EXPECT_THAT(all, Not(HasSubstr("CHECK FAILED")));
}

}  // namespace
}  // namespace dtrain::launcher::testing

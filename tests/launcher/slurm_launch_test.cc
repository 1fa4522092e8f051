// `dtrain launch --launcher slurm` inside a real allocation of a throwaway one-node Slurm cluster
// (Debian's slurmctld and slurmd) that each test brings up in a temporary directory.
//
// The cluster: this host as the only node (its configured CPUs need not exist:
// SlurmdParameters=config_overrides), non-default ports, state and spool in the temporary
// directory, no cgroups (proctrack/linuxproc, task/none: containers have none to give), and
// auth/none with cred/none (Slurm 22.05 still has them), so no munge daemon and key are needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "batch_test_support.h"
#include "cluster_daemons.h"
#include "launch_test_support.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kStartDeadline = std::chrono::seconds(60);

std::string Sbin(const std::string& name) {
  for (const std::string dir : {"/usr/sbin/", "/usr/local/sbin/"}) {
    if (FindProgram(dir + name)) return dir + name;
  }
  return FindProgram(name).value_or("");
}

class SlurmCluster {
 public:
  SlurmCluster() : daemons_("DTRAIN_TEST_SLURM=" + dir_.path().string()) {
    for (const char* client : {"sinfo", "salloc", "srun", "scontrol"}) {
      if (!FindProgram(client)) {
        skip_ = std::string(client) + " is not in PATH (apt install slurm-client)";
        return;
      }
    }
    const std::string ctld = Sbin("slurmctld"), slurmd = Sbin("slurmd");
    if (ctld.empty() || slurmd.empty()) {
      skip_ = "slurmctld/slurmd are not installed (apt install slurmctld slurmd)";
      return;
    }
    host_ = ShortHostname();
    const uint16_t ctld_port = PickFreePort();
    uint16_t slurmd_port = PickFreePort();
    while (slurmd_port == ctld_port) slurmd_port = PickFreePort();
    const std::string d = dir_.path().string();
    std::filesystem::create_directories(d + "/state");
    std::filesystem::create_directories(d + "/spool");
    std::ofstream(conf()) << "ClusterName=dtraintest\n"
                          << "SlurmctldHost=" << host_ << "\n"
                          << "SlurmctldPort=" << ctld_port << "\n"
                          << "SlurmdPort=" << slurmd_port << "\n"
                          << "SlurmUser=root\nSlurmdUser=root\n"
                          << "AuthType=auth/none\nCredType=cred/none\n"
                          << "StateSaveLocation=" << d << "/state\n"
                          << "SlurmdSpoolDir=" << d << "/spool\n"
                          << "SlurmctldPidFile=" << d << "/slurmctld.pid\n"
                          << "SlurmdPidFile=" << d << "/slurmd.pid\n"
                          << "SlurmctldLogFile=" << d << "/slurmctld.log\n"
                          << "SlurmdLogFile=" << d << "/slurmd.log\n"
                          << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                          << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
                          << "SlurmdParameters=config_overrides\n"
                          << "MpiDefault=none\nReturnToService=2\n"
                          << "JobAcctGatherType=jobacct_gather/none\n"
                          << "AccountingStorageType=accounting_storage/none\n"
                          << "NodeName=" << host_ << " CPUs=8 State=UNKNOWN\n"
                          << "PartitionName=debug Nodes=" << host_
                          << " Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
    const std::vector<EnvVar> env = {{"SLURM_CONF", conf()}};
    daemons_.Start({ctld, "-D", "-i"}, env, d + "/slurmctld.out");
    daemons_.Start({slurmd, "-D"}, env, d + "/slurmd.out");
    // Up when the node is idle: slurmd registered and the controller accepts jobs.
    const bool up = PollUntil(
        [&] {
          if (daemons_.AnyExited()) return true;
          bool ok = false;
          const std::string state =
              RunClient(Env(), {"sinfo", "-h", "-N", "-o", "%T", "-n", host_}, &ok);
          if (ok && state.find("idle") != std::string::npos) return true;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          return false;
        },
        kStartDeadline);
    if (!up || daemons_.AnyExited()) {
      skip_ = std::string("Slurm did not come up ") +
              (daemons_.AnyExited() ? "(a daemon exited)" : "within 60 s") + "; slurmctld:\n" +
              LogTail(d + "/slurmctld.log") + LogTail(d + "/slurmctld.out") + "slurmd:\n" +
              LogTail(d + "/slurmd.log") + LogTail(d + "/slurmd.out");
    }
  }

  const std::string& skip_reason() const { return skip_; }
  std::string conf() const { return (dir_.path() / "slurm.conf").string(); }
  std::vector<std::string> Env() const { return {"SLURM_CONF=" + conf()}; }

  // `salloc ARGS dtrain launch --launcher slurm LAUNCH_ARGS`: salloc runs the launcher inside a
  // new allocation (LaunchProcess execs its shell setup, which execs salloc with the launcher's
  // command line).
  std::unique_ptr<LaunchProcess> Salloc(const std::string& salloc_args,
                                        std::vector<std::string> launch_args) const {
    launch_args.insert(launch_args.begin(), {"--launcher", "slurm", "--kill-grace-ms", "3000"});
    return std::make_unique<LaunchProcess>(launch_args, Env(),
                                           "exec salloc --quiet " + salloc_args + " \"$@\"");
  }

 private:
  TempDir dir_;
  ClusterDaemons daemons_;
  std::string host_;
  std::string skip_;
};

#define START_SLURM(cluster) \
  SlurmCluster cluster;      \
  if (!cluster.skip_reason().empty()) GTEST_SKIP() << cluster.skip_reason()

TEST(SlurmLaunch, TwoWorkersTwoServersInsideAnAllocation) {
  REQUIRE_KV_CHECK_WORKER(worker);
  START_SLURM(cluster);
  auto launch = cluster.Salloc("-N1 -n4 --overcommit", {"-n", "2", "-s", "2", "--", worker,
                                                        "--scenario", "sync", "--rounds", "5"});
  LaunchResult r = launch->Wait(std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(dtrain launch: starting 1 scheduler here \(at 127\.0\.0\.1:\d+\), )"
                        R"(2 servers and 2 workers through srun in Slurm job \d+ \(1 node\))")))
      << r.err;
  EXPECT_THAT(r.out, TwoWorkersSynced());
}

TEST(SlurmLaunch, AllreduceTasksGetTheirRanksAndAFailureIsNamed) {
  START_SLURM(cluster);
  auto ok = cluster.Salloc("-N1 -n3", {"-n", "3", "-s", "0", "--", "sh", "-c",
                                       "echo rank=$DTRAIN_NODE_RANK procid=$SLURM_PROCID "
                                       "n=$DMLC_NUM_WORKER; echo err >&2"});
  LaunchResult r = ok->Wait(std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* n : {"0", "1", "2"}) {
    EXPECT_THAT(r.out,
                HasSubstr(std::string("[worker ") + n + "] rank=" + n + " procid=" + n + " n=3\n"));
    EXPECT_THAT(r.err, HasSubstr(std::string("[worker ") + n + "] err\n"));
  }

  auto failing = cluster.Salloc(
      "-N1 -n2", {"-n", "2", "-s", "0", "--", "sh", "-c",
                  "if [ $DTRAIN_NODE_RANK = 1 ]; then echo giving up >&2; exit 3; fi; "
                  "exec sleep 1000"});
  LaunchResult f = failing->Wait(std::chrono::seconds(120));
  EXPECT_EQ(f.exit_code, 3) << f.err;
  EXPECT_THAT(f.err, HasSubstr("[worker 1] giving up\n"));
  EXPECT_THAT(f.err, HasSubstr("dtrain launch: worker 1 exited with code 3 (reported by srun); "
                               "stopping the job\n"));
}

TEST(SlurmLaunch, DyingWorkerOfAParameterServerJobIsNamedByTheScheduler) {
  REQUIRE_KV_CHECK_WORKER(worker);
  START_SLURM(cluster);
  auto launch =
      cluster.Salloc("-N1 -n5 --overcommit", {"-n", "3", "-s", "2", "--", worker, "--scenario",
                                              "die", "--die-rank", "2", "--die-after", "4"});
  LaunchResult r = launch->Wait(std::chrono::seconds(120));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, CauseReportedByScheduler("worker 2")) << r.err;
}

TEST(SlurmLaunch, OutsideAnAllocationSaysHowToGetOne) {
  LaunchProcess launch({"--launcher", "slurm", "-n", "2", "--", "true"}, {},
                       "unset SLURM_JOB_ID SLURM_JOB_NODELIST SLURM_NODELIST");
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err,
              AllOf(HasSubstr("--launcher slurm runs inside a Slurm allocation"),
                    HasSubstr("salloc -N 2 dtrain launch --launcher slurm"), HasSubstr("sbatch")));
  EXPECT_THAT(r.err, Not(HasSubstr("starting")));
}

TEST(SlurmLaunch, AHostfileIsRefused) {
  LaunchResult r = RunLaunch({"--launcher", "slurm", "-H", "/etc/hostname", "-n", "1", "true"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("-H/--hostfile does not apply to --launcher slurm"));
}

}  // namespace
}  // namespace dtrain::launcher::testing

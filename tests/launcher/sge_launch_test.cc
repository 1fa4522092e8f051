// `dtrain launch --launcher sge` against a throwaway one-host Grid Engine cell (Debian's
// gridengine-master, -exec and -client) that each test installs in a temporary directory.
//
// Bringing a cell up in a test (all of it under the temporary SGE_ROOT, non-default ports):
//   - SGE_ROOT gets links to the installed programs; the installer insists on programs Debian does
//     not ship (qmake, qmon, rsh, ...), which get stubs;
//   - the installer (inst_sge -m -auto) creates the cell and its spool, but refuses a host name
//     that resolves to 127.0.0.1, as containers often have it ("vm" in /etc/hosts): our copy of
//     its check is patched out, and the cell's host_aliases maps "localhost" (what 127.0.0.1
//     resolves back to) to the host name, which sge_qmaster's own check needs. Our copy also
//     ends where the installer would start the daemon itself;
//   - the daemons run in the foreground (SGE_ND) as the test's children; jobs of root need
//     min_uid/min_gid 0; a queue with enough slots for every task at once, scheduled every second.
// A test skips, saying why, only when the cell cannot be brought up.
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
constexpr char kCell[] = "dtraintest";
constexpr char kPrograms[] = "/usr/lib/gridengine";
constexpr char kShared[] = "/usr/share/gridengine";

// Lays out SGE_ROOT=$1 for architecture $2 (see the top of the file).
constexpr char kLayoutScript[] = R"(set -e
R=$1; A=$2; P=$3; S=$4
mkdir -p "$R/bin/$A" "$R/utilbin/$A" "$R/lib"
for f in "$P"/*; do ln -s "$f" "$R/bin/$A/"; ln -s "$f" "$R/utilbin/$A/"; done
for d in bin utilbin; do
  for f in qacct qalter qconf qdel qhold qhost qlogin qmake qmod qmon qping qquota qresub qrls \
           qrsh qselect qsh qstat qsub qtcsh sge_coshepherd sge_execd sge_qmaster sge_shadowd \
           sge_shepherd adminrun authuser checkprog checkuser filestat gethostbyaddr \
           gethostbyname gethostname getservbyname infotext loadcheck now qrsh_starter rlogin \
           rsh rshd testsuidroot uidgid; do
    F="$R/$d/$A/$f"
    [ -e "$F" ] || { printf '#!/bin/sh\nexit 1\n' > "$F"; chmod +x "$F"; }
  done
done
cp -r "$S/util" "$R/util"
for f in inst_sge install_qmaster install_execd; do ln -s "$S/$f" "$R/$f"; done
M="$R/util/install_modules"
# The installer's refusal of a host name on 127.0.0.1 (see above).
sed -i 's/^CheckForLocalHostResolving()$/&\n{ return 0; }\nCheckForLocalHostResolving_original()/' \
  "$M/inst_common.sh"
# The installer ends where it would start sge_qmaster as a daemon (and wait up to a minute for
# it): the cell is complete by then, and the test starts the daemons itself.
sed -i 's/^StartQmaster()$/&\n{ exit 0; }\nStartQmaster_original()/' "$M/inst_qmaster.sh"
)";

class SgeCluster {
 public:
  SgeCluster()
      : root_((dir_.path() / "root").string()),
        daemons_("DTRAIN_TEST_SGE=" + dir_.path().string()) {
    for (const char* client : {"qsub", "qdel", "qconf", "qstat"}) {
      if (!FindProgram(client)) {
        skip_ = std::string(client) + " is not in PATH (apt install gridengine-client)";
        return;
      }
    }
    if (!FindProgram(std::string(kPrograms) + "/sge_qmaster") ||
        !FindProgram(std::string(kPrograms) + "/sge_execd") ||
        !std::filesystem::exists(std::string(kShared) + "/inst_sge")) {
      skip_ =
          "Grid Engine's daemons or installer are not installed (apt install "
          "gridengine-master gridengine-exec)";
      return;
    }
    host_ = ShortHostname();
    arch_ = RunClient({}, {std::string(kShared) + "/util/arch"});
    while (!arch_.empty() && std::isspace(static_cast<unsigned char>(arch_.back())))
      arch_.pop_back();
    qmaster_port_ = PickFreePort();
    execd_port_ = PickFreePort();
    while (execd_port_ == qmaster_port_) execd_port_ = PickFreePort();
    if (!Install() || !StartQmaster() || !Configure() || !StartExecd()) return;
  }

  const std::string& skip_reason() const { return skip_; }

  std::vector<std::string> Env() const {
    return {"SGE_ROOT=" + root_, std::string("SGE_CELL=") + kCell,
            "SGE_QMASTER_PORT=" + std::to_string(qmaster_port_),
            "SGE_EXECD_PORT=" + std::to_string(execd_port_)};
  }

  // `dtrain launch --launcher sge ARGS`, run from `dir` (the tasks' output goes under it).
  std::unique_ptr<LaunchProcess> Launch(const TempDir& dir, std::vector<std::string> args) const {
    args.insert(args.begin(), {"--launcher", "sge", "--kill-grace-ms", "3000"});
    return std::make_unique<LaunchProcess>(args, Env(), "cd '" + dir.path().string() + "'");
  }

  // The job list (`qstat`); empty when nothing is queued or running.
  std::string Qstat() const { return RunClient(Env(), {"qstat"}); }

 private:
  std::string Cell() const { return root_ + "/" + kCell; }
  std::string Messages(const std::string& daemon_dir) const {
    return LogTail(Cell() + "/spool/" + daemon_dir + "/messages");
  }
  std::vector<EnvVar> DaemonEnv() const {
    std::vector<EnvVar> env;
    for (const std::string& e : Env())
      env.emplace_back(e.substr(0, e.find('=')), e.substr(e.find('=') + 1));
    env.emplace_back("SGE_ND", "1");  // stay in the foreground
    return env;
  }

  bool Fail(const std::string& why) {
    skip_ = "Grid Engine could not be brought up: " + why;
    return false;
  }

  // Client command as the cell's admin; false (and the reason in skip_) when it fails.
  bool Qconf(const std::vector<std::string>& args, const std::string& what) {
    std::vector<std::string> argv = {"qconf"};
    argv.insert(argv.end(), args.begin(), args.end());
    bool ok = false;
    const std::string out = RunClient(Env(), argv, &ok);
    return ok || Fail(what + ": " + out);
  }

  bool Install() {
    bool ok = false;
    const std::string out = RunClient(
        {}, {"/bin/sh", "-c", kLayoutScript, "layout", root_, arch_, kPrograms, kShared}, &ok);
    if (!ok) return Fail("laying out SGE_ROOT failed: " + out);
    const std::string conf = (dir_.path() / "install.conf").string();
    const std::string spool = Cell() + "/spool";
    std::ofstream(conf)
        << "SGE_ROOT=\"" << root_ << "\"\nSGE_QMASTER_PORT=" << qmaster_port_
        << "\nSGE_EXECD_PORT=" << execd_port_
        << "\nSGE_ENABLE_SMF=\"false\"\nSGE_CLUSTER_NAME=dtraintest\n"
        << "SGE_JMX_PORT=\"0\"\nSGE_JMX_SSL=\"false\"\nSGE_JMX_SSL_CLIENT=\"false\"\n"
        << "SGE_JMX_SSL_KEYSTORE=\"x\"\nSGE_JMX_SSL_KEYSTORE_PW=\"x\"\n"
        << "SGE_JVM_LIB_PATH=\"x\"\nSGE_ADDITIONAL_JVM_ARGS=\"\"\n"
        << "CELL_NAME=\"" << kCell << "\"\nADMIN_USER=root\n"
        << "QMASTER_SPOOL_DIR=\"" << spool << "/qmaster\"\n"
        << "EXECD_SPOOL_DIR=\"" << spool << "\"\nGID_RANGE=\"20000-20100\"\n"
        << "SPOOLING_METHOD=\"classic\"\nDB_SPOOLING_DIR=\"spooldb\"\n"
        << "PAR_EXECD_INST_COUNT=\"1\"\nADMIN_HOST_LIST=\"" << host_ << "\"\n"
        << "SUBMIT_HOST_LIST=\"" << host_ << "\"\nEXEC_HOST_LIST=\"" << host_
        << "\"\nEXECD_SPOOL_DIR_LOCAL=\"\"\nHOSTNAME_RESOLVING=\"true\"\n"
        << "SHELL_NAME=\"ssh\"\nCOPY_COMMAND=\"scp\"\nDEFAULT_DOMAIN=\"none\"\n"
        << "ADMIN_MAIL=\"none\"\nADD_TO_RC=\"false\"\nSET_FILE_PERMS=\"false\"\n"
        << "RESCHEDULE_JOBS=\"wait\"\nSCHEDD_CONF=\"1\"\nSHADOW_HOST=\"\"\n"
        << "EXEC_HOST_LIST_RM=\"\"\nREMOVE_RC=\"false\"\nWINDOWS_SUPPORT=\"false\"\n"
        << "WIN_ADMIN_NAME=\"Administrator\"\nWIN_DOMAIN_ACCESS=\"false\"\n"
        << "CSP_RECREATE=\"true\"\nCSP_COPY_CERTS=\"false\"\n";
    // Its exit code says nothing useful (it stops early on purpose); the cell's files do. Should a
    // daemon have started anyway, it carries our marker and is stopped below.
    const std::string marker = "DTRAIN_TEST_SGE=" + dir_.path().string();
    const std::string install_out = RunClient(
        {"SGE_ROOT=" + root_, marker},
        {"/bin/sh", "-c", "cd \"$SGE_ROOT\" && exec ./inst_sge -m -auto \"$1\"", "inst", conf},
        nullptr, std::chrono::seconds(180));
    for (pid_t p : ProcessesWithEnv(marker)) ::kill(p, SIGKILL);
    if (!std::filesystem::exists(Cell() + "/common/bootstrap")) {
      return Fail("inst_sge did not create the cell:\n" + install_out);
    }
    // 127.0.0.1 resolves back to "localhost": the same host, for the daemons' checks.
    std::ofstream(Cell() + "/common/host_aliases") << host_ << " localhost\n";
    std::ofstream(Cell() + "/common/act_qmaster") << host_ << "\n";
    return true;
  }

  bool StartQmaster() {
    daemons_.Start({root_ + "/bin/" + arch_ + "/sge_qmaster"}, DaemonEnv(),
                   (dir_.path() / "qmaster.out").string());
    const bool up = PollUntil(
        [&] {
          bool ok = false;
          RunClient(Env(), {"qconf", "-sh"}, &ok, std::chrono::seconds(5));
          if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(200));
          return ok || daemons_.AnyExited();
        },
        kStartDeadline);
    if (up && !daemons_.AnyExited()) return true;
    return Fail("sge_qmaster does not answer:\n" + Messages("qmaster") +
                LogTail((dir_.path() / "qmaster.out").string()));
  }

  bool Configure() {
    // Jobs of root: the default configuration refuses uid/gid below 100.
    std::string global = RunClient(Env(), {"qconf", "-sconf"});
    global = std::regex_replace(global, std::regex(R"((^|\n)(min_uid|min_gid)\s+\d+)"), "$1$2 0");
    global = std::regex_replace(global, std::regex(R"((^|\n)#[^\n]*)"), "$1");
    std::filesystem::create_directories(dir_.path() / "conf");
    std::ofstream((dir_.path() / "conf/global").string()) << global;
    std::string sched = RunClient(Env(), {"qconf", "-ssconf"});
    sched = std::regex_replace(sched, std::regex(R"((^|\n)schedule_interval\s+\S+)"),
                               "$1schedule_interval 0:0:1");
    sched = std::regex_replace(
        sched, std::regex(R"((^|\n)(flush_submit_sec|flush_finish_sec)\s+\d+)"), "$1$2 1");
    std::ofstream((dir_.path() / "conf/sched").string()) << sched;
    std::ofstream((dir_.path() / "conf/queue").string())
        << "qname all.q\nhostlist " << host_
        << "\nseq_no 0\nload_thresholds NONE\nsuspend_thresholds NONE\nnsuspend 1\n"
        << "suspend_interval 00:05:00\npriority 0\nmin_cpu_interval 00:05:00\n"
        << "processors UNDEFINED\nqtype BATCH INTERACTIVE\nckpt_list NONE\npe_list make\n"
        << "rerun FALSE\nslots 16\ntmpdir /tmp\nshell /bin/sh\nprolog NONE\nepilog NONE\n"
        << "shell_start_mode unix_behavior\nstarter_method NONE\nsuspend_method NONE\n"
        << "resume_method NONE\nterminate_method NONE\nnotify 00:00:60\nowner_list NONE\n"
        << "user_lists NONE\nxuser_lists NONE\nsubordinate_list NONE\ncomplex_values NONE\n"
        << "projects NONE\nxprojects NONE\ncalendar NONE\ninitial_state default\n";
    for (const char* limit :
         {"s_rt", "h_rt", "s_cpu", "h_cpu", "s_fsize", "h_fsize", "s_data", "h_data", "s_stack",
          "h_stack", "s_core", "h_core", "s_rss", "h_rss", "s_vmem", "h_vmem"}) {
      std::ofstream((dir_.path() / "conf/queue").string(), std::ios::app) << limit << " INFINITY\n";
    }
    const std::string conf = (dir_.path() / "conf").string();
    return Qconf({"-Mconf", conf + "/global"}, "setting min_uid 0") &&
           Qconf({"-Msconf", conf + "/sched"}, "setting the scheduling interval") &&
           Qconf({"-as", host_}, "adding the submit host") &&
           Qconf({"-Aq", conf + "/queue"}, "adding the queue");
  }

  bool StartExecd() {
    daemons_.Start({root_ + "/bin/" + arch_ + "/sge_execd"}, DaemonEnv(),
                   (dir_.path() / "execd.out").string());
    // Ready when a job runs through.
    const bool ran = PollUntil(
        [&] {
          bool ok = false;
          RunClient(
              Env(),
              {"qsub", "-sync", "y", "-b", "y", "-o", "/dev/null", "-e", "/dev/null", "/bin/true"},
              &ok, std::chrono::seconds(20));
          if (!ok) RunClient(Env(), {"qmod", "-c", "all.q"});  // clear an error state
          return ok || daemons_.AnyExited();
        },
        kStartDeadline);
    if (ran && !daemons_.AnyExited()) return true;
    return Fail("no job ran on sge_execd:\n" + Messages("qmaster") + Messages(host_) +
                LogTail((dir_.path() / "execd.out").string()));
  }

  TempDir dir_;
  std::string root_;
  ClusterDaemons daemons_;
  std::string host_, arch_;
  uint16_t qmaster_port_ = 0, execd_port_ = 0;
  std::string skip_;
};

#define START_SGE(cell) \
  SgeCluster cell;      \
  if (!cell.skip_reason().empty()) GTEST_SKIP() << cell.skip_reason()

TEST(SgeLaunch, TwoWorkersTwoServersAsArrayJobs) {
  REQUIRE_KV_CHECK_WORKER(worker);
  START_SGE(cell);
  TempDir cwd;
  auto launch =
      cell.Launch(cwd, {"-n", "2", "-s", "2", "--", worker, "--scenario", "sync", "--rounds", "5"});
  LaunchResult r = launch->Wait(std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("2 servers and 2 workers as Grid Engine array jobs"));
  EXPECT_THAT(r.out, TwoWorkersSynced());
  // The tasks' output files are gone with their directory.
  for (const auto& e : std::filesystem::directory_iterator(cwd.path())) {
    ADD_FAILURE() << "left behind: " << e.path();
  }
}

TEST(SgeLaunch, FailingTaskIsNamedAndTheJobDeleted) {
  START_SGE(cell);
  TempDir cwd;
  auto launch = cell.Launch(
      cwd, {"-n", "3", "-s", "0", "--", "sh", "-c",
            "echo rank=$DTRAIN_NODE_RANK task=$SGE_TASK_ID; "
            "if [ $DTRAIN_NODE_RANK = 1 ]; then echo giving up >&2; exit 3; fi; exec sleep 1000"});
  LaunchResult r = launch->Wait(std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("[worker 0] rank=0 task=1\n"),
                           HasSubstr("[worker 1] rank=1 task=2\n")));
  EXPECT_THAT(r.err, HasSubstr("[worker 1] giving up\n"));
  EXPECT_THAT(r.err, HasSubstr("dtrain launch: worker 1 exited with code 3 (reported by qsub); "
                               "stopping the job\n"));
  // qdel removed the tasks that still ran.
  EXPECT_TRUE(PollUntil([&] { return cell.Qstat().empty(); }, std::chrono::seconds(30)))
      << cell.Qstat();
}

TEST(SgeLaunch, DyingWorkerOfAParameterServerJobIsNamedByTheScheduler) {
  REQUIRE_KV_CHECK_WORKER(worker);
  START_SGE(cell);
  TempDir cwd;
  auto launch = cell.Launch(cwd, {"-n", "3", "-s", "2", "--", worker, "--scenario", "die",
                                  "--die-rank", "2", "--die-after", "4"});
  LaunchResult r = launch->Wait(std::chrono::seconds(120));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, CauseReportedByScheduler("worker 2")) << r.err;
  EXPECT_TRUE(PollUntil([&] { return cell.Qstat().empty(); }, std::chrono::seconds(30)))
      << cell.Qstat();
}

TEST(SgeLaunch, MissingQsubIsAClearUsageError) { ExpectMissingProgramIsAUsageError("sge", "qsub"); }

}  // namespace
}  // namespace dtrain::launcher::testing

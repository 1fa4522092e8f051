// The mpirun command lines, the job's plan as one command per role, and reading mpirun's tagged
// output back into tasks: no mpirun runs here.
#include "launcher/plan/cluster_tools/mpi_launcher_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "batch_test_support.h"
#include "launch_test_support.h"
#include "launcher/run/cluster_tools/mpi_output.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

LaunchOptions Options(int workers, int servers) {
  LaunchOptions o;
  o.num_workers = workers;
  o.num_servers = servers;
  o.worker_command = {"python", "train.py", "--lr", "0.1"};
  o.env_all = {{"OMP_NUM_THREADS", "4"}};
  o.env_worker = {{"DMLC_NODE_HOST", "mine"}};
  return o;
}

TEST(TaskPlan, OneCommandPerRoleWithoutRankOrTheLaunchersNodeHost) {
  const LaunchOptions o = Options(3, 2);
  const JobPlan plan = BuildJobPlan(o, PlaceLocally(2, 3), "/bin/dtrain", 9000);
  const TaskPlan tasks = ToTaskPlan(plan, o);
  ASSERT_TRUE(tasks.scheduler.has_value());
  EXPECT_EQ(tasks.scheduler->argv, (std::vector<std::string>{"/bin/dtrain", "scheduler"}));
  ASSERT_EQ(tasks.roles.size(), 2u);
  EXPECT_EQ(tasks.roles[0].role, Role::kServer);
  EXPECT_EQ(tasks.roles[0].count, 2);
  EXPECT_EQ(tasks.roles[0].argv, (std::vector<std::string>{"/bin/dtrain", "server"}));
  EXPECT_EQ(tasks.roles[1].role, Role::kWorker);
  EXPECT_EQ(tasks.roles[1].count, 3);
  EXPECT_EQ(tasks.roles[1].argv, o.worker_command);
  for (const RoleTasks& r : tasks.roles) {
    std::map<std::string, std::string> env;
    std::vector<std::string> node_hosts;
    for (const auto& [name, value] : r.env) {
      env[name] = value;
      if (name == "DMLC_NODE_HOST") node_hosts.push_back(value);
    }
    EXPECT_EQ(env.count("DTRAIN_NODE_RANK"), 0u);
    EXPECT_EQ(env["DMLC_ROLE"], RoleName(r.role));
    EXPECT_EQ(env["DMLC_PS_ROOT_URI"], "127.0.0.1");
    EXPECT_EQ(env["DMLC_PS_ROOT_PORT"], "9000");
    EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
    // The launcher's own is dropped (the node finds its address); the user's stays.
    if (r.role == Role::kWorker) {
      EXPECT_THAT(node_hosts, ElementsAre("mine"));
    } else {
      EXPECT_THAT(node_hosts, IsEmpty());
    }
  }
}

TEST(TaskPlan, AllreduceJobHasNoScheduler) {
  const LaunchOptions o = Options(4, 0);
  const TaskPlan tasks = ToTaskPlan(BuildJobPlan(o, PlaceLocally(0, 4), "/bin/dtrain", 9000), o);
  EXPECT_FALSE(tasks.scheduler.has_value());
  ASSERT_EQ(tasks.roles.size(), 1u);
  EXPECT_EQ(tasks.roles[0].role, Role::kWorker);
  EXPECT_EQ(tasks.roles[0].count, 4);
}

TEST(TaskPlan, RankComesFromTheToolsVariable) {
  EXPECT_EQ(CommandWithRankFrom("${X:?}", {"a b", "c"}),
            (std::vector<std::string>{
                "/bin/sh", "-c", "DTRAIN_NODE_RANK=${X:?}; export DTRAIN_NODE_RANK; exec \"$@\"",
                "dtrain-task", "a b", "c"}));
}

TEST(MpirunCommand, LocalJobOversubscribesAndPassesVariablesByName) {
  MpirunRequest r;
  r.mpirun = "/usr/bin/mpirun";
  r.tasks.role = Role::kWorker;
  r.tasks.count = 3;
  r.tasks.argv = {"python", "train.py"};
  r.tasks.env = {{"DMLC_ROLE", "worker"}, {"PATH", "/x"}, {"A", "1,2 3"}};
  r.forwarded = {"PATH", "LD_LIBRARY_PATH"};
  EXPECT_EQ(MpirunCommand(r),
            (std::vector<std::string>{
                "/usr/bin/mpirun",
                "--tag-output",
                "--bind-to",
                "none",
                "--oversubscribe",
                "-np",
                "3",
                "-x",
                "PATH",
                "-x",
                "LD_LIBRARY_PATH",
                "-x",
                "DMLC_ROLE",
                "-x",
                "A",
                "/bin/sh",
                "-c",
                "DTRAIN_NODE_RANK=${OMPI_COMM_WORLD_RANK:?}; export DTRAIN_NODE_RANK; \"$@\"; "
                "s=$?; [ \"$s\" -eq 0 ] || echo \"dtrain-task-exit-status: $s\" >&2; exit \"$s\"",
                "dtrain-task",
                "python",
                "train.py"}));
}

// The task wrapper as mpirun runs it: rank from OMPI_COMM_WORLD_RANK, the command's arguments
// unchanged, its status passed on, and the marker only on failure.
TEST(MpiTaskCommand, ReportsAFailureAndPassesTheStatusOn) {
  auto run = [](const std::string& rank, const std::string& script, std::string* err) {
    TempDir dir;
    std::vector<std::string> argv = MpiTaskCommand({"sh", "-c", script, "sh", "it's", "a b"});
    std::string cmd = "OMPI_COMM_WORLD_RANK=" + rank;
    for (const std::string& a : argv) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      cmd += " " + q + "'";
    }
    cmd += " > " + dir / "out" + " 2> " + dir / "err";
    const int status = std::system(cmd.c_str());
    *err = ReadFile(dir / "err");
    return std::make_pair(WEXITSTATUS(status), ReadFile(dir / "out"));
  };
  std::string err;
  auto [code, out] = run("2", "echo \"$DTRAIN_NODE_RANK|$1|$2\"", &err);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(out, "2|it's|a b\n");
  EXPECT_EQ(err, "");
  std::tie(code, out) = run("0", "echo bye >&2; exit 3", &err);
  EXPECT_EQ(code, 3);
  EXPECT_EQ(err, "bye\ndtrain-task-exit-status: 3\n");
}

TEST(MpirunCommand, HostfileAsRootSpreadsServersOverHosts) {
  MpirunRequest r;
  r.tasks.role = Role::kServer;
  r.tasks.count = 2;
  r.tasks.argv = {"/bin/dtrain", "server"};
  r.hostfile = "/tmp/hosts";
  r.as_root = true;
  const std::vector<std::string> argv = MpirunCommand(r);
  EXPECT_THAT(std::vector<std::string>(argv.begin(), argv.begin() + 11),
              ElementsAre("mpirun", "--tag-output", "--bind-to", "none", "--allow-run-as-root",
                          "--hostfile", "/tmp/hosts", "--map-by", "node", "-np", "2"));
  // Workers fill each host's slots in order: no --map-by.
  r.tasks.role = Role::kWorker;
  const std::vector<std::string> workers = MpirunCommand(r);
  EXPECT_EQ(std::count(workers.begin(), workers.end(), "--map-by"), 0);
}

TEST(OpenMpiHostfile, SlotsAndRepeatedHosts) {
  EXPECT_EQ(OpenMpiHostfile({{"node-a", 1}, {"10.0.0.2", 4}, {"node-a", 2}}),
            "# written by dtrain launch --launcher mpi\nnode-a slots=3\n10.0.0.2 slots=4\n");
}

TEST(MpiOutputParser, PiecesWithoutNewlineAreJoinedPerTask) {
  // What mpirun --tag-output wrote for two ranks that each printed "x\ny", then "z\n\nw\n".
  const std::string out =
      "[1,0]<stdout>:x\n"
      "[1,0]<stdout>:y[1,1]<stdout>:x\n"
      "[1,1]<stdout>:y[1,0]<stdout>:z\n"
      "[1,0]<stdout>:\n"
      "[1,0]<stdout>:w\n"
      "[1,1]<stdout>:z\n"
      "[1,1]<stdout>:\n"
      "[1,1]<stdout>:w\n";
  for (bool bytewise : {false, true}) {
    MpiOutputParser parser;
    ParsedOutput p = bytewise ? FeedBytewise(parser, out, false) : FeedWhole(parser, out, false);
    EXPECT_THAT(p.task_out, ElementsAre(Pair(0, "x\nyz\n\nw\n"), Pair(1, "x\nyz\n\nw\n")));
    EXPECT_THAT(p.tool_lines, IsEmpty());
  }
}

TEST(MpiOutputParser, UntaggedLinesAreMpirunsOwnAndTagLikeTextStaysText) {
  const std::string err =
      "[1,2]<stderr>:a [bracket] and [1,x]<stdout>: not a tag\n"
      "------\n"
      "[1,2]<stderr>:last words";
  for (bool bytewise : {false, true}) {
    MpiOutputParser parser;
    ParsedOutput p = bytewise ? FeedBytewise(parser, err, true) : FeedWhole(parser, err, true);
    EXPECT_THAT(p.task_err,
                ElementsAre(Pair(2, "a [bracket] and [1,x]<stdout>: not a tag\nlast words")));
    EXPECT_THAT(p.tool_lines, ElementsAre("------"));
  }
}

TEST(MpiOutputParser, ATasksExitMarkerIsTakenOutAndReported) {
  const std::string err =
      "[1,1]<stderr>:partial[1,1]<stderr>:dtrain-task-exit-status: 3\n"
      "[1,0]<stderr>:dtrain-task-exit-status: 137\n"
      "[1,2]<stderr>:dtrain-task-exit-status: is what I print\n"
      "[1,2]<stderr>:dtrain-task-ex";
  for (bool bytewise : {false, true}) {
    MpiOutputParser parser;
    ParsedOutput p = bytewise ? FeedBytewise(parser, err, true) : FeedWhole(parser, err, true);
    EXPECT_THAT(p.task_err,
                ElementsAre(Pair(1, "partial"), Pair(2,
                                                     "dtrain-task-exit-status: is what I print\n"
                                                     "dtrain-task-ex")));
    ASSERT_EQ(p.failures.size(), 2u);
    EXPECT_EQ(p.failures[0].task, 1);
    EXPECT_EQ(p.failures[0].exit_code, 3);
    EXPECT_EQ(p.failures[0].description, "exited with code 3");
    EXPECT_EQ(p.failures[1].task, 0);
    EXPECT_EQ(p.failures[1].exit_code, 137);
    EXPECT_EQ(p.failures[1].description, "was killed by signal 9 (SIGKILL)");
  }
}

TEST(MpiOutputParser, FailureReports) {
  MpiOutputParser parser;
  EXPECT_FALSE(parser.StoppingByItself());
  EXPECT_FALSE(parser.FailureIn("Primary job  terminated normally, but 1 process returned"));
  EXPECT_FALSE(
      parser.FailureIn("a non-zero exit code. Per user-direction, the job has been aborted."));
  EXPECT_TRUE(parser.StoppingByItself());
  EXPECT_FALSE(parser.FailureIn("  Process name: [[9806,1],12]"));
  std::optional<TaskFailure> f = parser.FailureIn("  Exit code:    3");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->task, 12);
  EXPECT_EQ(f->exit_code, 3);
  EXPECT_EQ(f->description, "exited with code 3");

  f = parser.FailureIn(
      "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->task, 1);
  EXPECT_EQ(f->exit_code, 137);
  EXPECT_EQ(f->description, "was killed by signal 9 (SIGKILL)");

  // "Exit code:" alone (no process named before it) is not a report.
  EXPECT_FALSE(MpiOutputParser().FailureIn("  Exit code:    3"));
}

}  // namespace
}  // namespace dtrain::launcher::testing

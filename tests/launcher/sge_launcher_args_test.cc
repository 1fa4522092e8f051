// The qsub command lines, the job scripts and reading what `qsub -sync y` says: no Grid Engine
// here.
#include "launcher/plan/cluster_tools/sge_launcher_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "batch_test_support.h"
#include "launch_test_support.h"
#include "launcher/run/cluster_tools/sge_output.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::HasSubstr;

RoleTasks Workers() {
  RoleTasks t;
  t.role = Role::kWorker;
  t.count = 3;
  t.argv = {"python", "train.py", "it's", "a b"};
  t.env = {{"DMLC_ROLE", "worker"}, {"NOTE", "has, commas and 'quotes'"}};
  return t;
}

TEST(QsubCommand, ArrayJobWaitedForWithOutputFiles) {
  EXPECT_EQ(
      QsubCommand("/usr/bin/qsub", Workers(), "/work/.dtrain-sge-x", "/work/.dtrain-sge-x/job"),
      (std::vector<std::string>{
          "/usr/bin/qsub", "-sync", "y", "-terse", "-t", "1-3", "-N", "dtrain-workers", "-S",
          "/bin/sh", "-cwd", "-V", "-o", "/work/.dtrain-sge-x/worker.$TASK_ID.out", "-e",
          "/work/.dtrain-sge-x/worker.$TASK_ID.err", "/work/.dtrain-sge-x/job"}));
  EXPECT_EQ(SgeTaskOutputPath("/d", Role::kServer, 0, true), "/d/server.1.err");
  EXPECT_EQ(SgeTaskOutputPath("/d", Role::kWorker, 2, false), "/d/worker.3.out");
}

TEST(SgeJobScript, SetsRankAndVariablesThenRunsTheCommand) {
  const std::string script = SgeJobScript(Workers());
  EXPECT_THAT(script, HasSubstr("DTRAIN_NODE_RANK=$((${SGE_TASK_ID:?} - 1))\n"));
  // Run it as Grid Engine would, for task 2: it must print rank 1 and the values unchanged.
  TempDir dir;
  RoleTasks t = Workers();
  t.argv = {"/bin/sh", "-c",   "echo \"$DTRAIN_NODE_RANK|$DMLC_ROLE|$NOTE|$1|$2\"",
            "sh",      "it's", "a b"};
  std::ofstream(dir / "job") << SgeJobScript(t);
  const std::string cmd = "SGE_TASK_ID=2 /bin/sh " + dir / "job" + " > " + dir / "out";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(ReadFile(dir / "out"), "1|worker|has, commas and 'quotes'|it's|a b\n");
  // Outside Grid Engine it refuses to run with no rank.
  const std::string bare = "env -u SGE_TASK_ID /bin/sh " + dir / "job" + " 2>/dev/null";
  EXPECT_NE(std::system(bare.c_str()), 0);
}

TEST(QsubOutputParser, JobIdFailuresAndCancel) {
  QsubOutputParser parser("/usr/bin/qdel");
  EXPECT_TRUE(parser.CancelCommand().empty());
  EXPECT_FALSE(parser.FailureIn("12.1-4:1"));
  EXPECT_EQ(parser.job_id(), "12");
  EXPECT_EQ(parser.CancelCommand(), (std::vector<std::string>{"/usr/bin/qdel", "12"}));

  EXPECT_FALSE(parser.FailureIn("Job 12.1 exited with exit code 0."));
  std::optional<TaskFailure> f = parser.FailureIn("Job 12.3 exited with exit code 3.");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->task, 2);
  EXPECT_EQ(f->exit_code, 3);
  f = parser.FailureIn("Job 12.2 exited because of signal SIGKILL");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->task, 1);
  EXPECT_EQ(f->exit_code, 137);
  EXPECT_EQ(f->description, "was killed by signal 9 (SIGKILL)");
  f = parser.FailureIn("Unable to run job 12.4");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->task, 3);

  QsubOutputParser verbose("qdel");
  EXPECT_FALSE(verbose.FailureIn("Your job-array 7.1-2:1 (\"dtrain-workers\") has been submitted"));
  EXPECT_EQ(verbose.job_id(), "7");
}

}  // namespace
}  // namespace dtrain::launcher::testing

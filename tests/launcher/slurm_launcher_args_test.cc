// The srun command lines and reading `srun --label` output back into tasks: no Slurm here.
#include "launcher/plan/cluster_tools/slurm_launcher_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "batch_test_support.h"
#include "launcher/run/cluster_tools/slurm_output.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

TEST(SrunCommand, OneStepPerRolePlacedByTheHostfile) {
  RoleTasks t;
  t.role = Role::kServer;
  t.count = 2;
  t.argv = {"/bin/dtrain", "server"};
  EXPECT_EQ(
      SrunCommand("/usr/bin/srun", t),
      (std::vector<std::string>{
          "/usr/bin/srun", "--ntasks=2", "--distribution=arbitrary", "--overlap", "--overcommit",
          "--kill-on-bad-exit=1", "--label", "--export=ALL", "--job-name=dtrain-servers", "/bin/sh",
          "-c", "DTRAIN_NODE_RANK=${SLURM_PROCID:?}; export DTRAIN_NODE_RANK; exec \"$@\"",
          "dtrain-task", "/bin/dtrain", "server"}));
  EXPECT_EQ(SlurmHostfile({"n1", "n2", "n1"}), "n1\nn2\nn1\n");
}

TEST(SrunCommand, NodelistExpansion) {
  EXPECT_EQ(ExpandNodelistCommand("scontrol", "n[1-2]"),
            (std::vector<std::string>{"scontrol", "show", "hostnames", "n[1-2]"}));
  EXPECT_THAT(ParseHostnames("n1\nn2\n\n"), ElementsAre("n1", "n2"));
}

TEST(SrunOutputParser, LabelledLinesGoToTheirTasks) {
  const std::string out = " 0: hello\n10: ten\n 1: \n 1:\nsrun: warning: something\n 3: no newline";
  for (bool bytewise : {false, true}) {
    SrunOutputParser parser;
    ParsedOutput p = bytewise ? FeedBytewise(parser, out, false) : FeedWhole(parser, out, false);
    EXPECT_THAT(p.task_out, ElementsAre(Pair(0, "hello\n"), Pair(1, "\n\n"),
                                        Pair(3, "no newline\n"), Pair(10, "ten\n")));
    EXPECT_THAT(p.tool_lines, ElementsAre("srun: warning: something"));
    EXPECT_THAT(p.task_err, IsEmpty());
  }
}

TEST(SrunOutputParser, FailureReports) {
  SrunOutputParser parser;
  std::optional<TaskFailure> f =
      parser.FailureIn("srun: error: vm: task 1: Exited with exit code 3");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->task, 1);
  EXPECT_EQ(f->exit_code, 3);
  EXPECT_EQ(f->description, "exited with code 3");

  f = parser.FailureIn("srun: error: node-7: tasks 0-1: Killed");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->task, 0);
  EXPECT_EQ(f->exit_code, 137);
  EXPECT_EQ(f->description, "was killed by signal 9 (SIGKILL)");

  f = parser.FailureIn("srun: error: vm: task 2: Segmentation fault (core dumped)");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->exit_code, 139);

  EXPECT_FALSE(parser.FailureIn("srun: Job step aborted: Waiting up to 32 seconds"));
  EXPECT_FALSE(parser.FailureIn("srun: error: Unable to create step for job 3"));
}

}  // namespace
}  // namespace dtrain::launcher::testing

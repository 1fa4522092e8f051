// Which failure a job run through cluster tools names: the evidence arrives in the orders seen
// with real mpirun jobs (see cluster_tool_culprit.h).
#include <gtest/gtest.h>

#include "launcher/watch/cluster_tool_culprit.h"

namespace dtrain::launcher::testing {
namespace {

constexpr int kServers = 1;  // front-end ids, as the caller picks them
constexpr int kWorkers = 2;

// What the scheduler reports when worker 2's connection drops.
const FailureRecord kSchedulerRecord{{Role::kWorker, 2},
                                     "127.0.0.1",
                                     "its connection closed (the process exited or died)",
                                     "scheduler"};

TEST(CulpritFinder, NothingFailedNothingToName) {
  CulpritFinder f(true);
  EXPECT_FALSE(f.AnyFailure());
  EXPECT_FALSE(f.Best().has_value());
}

TEST(CulpritFinder, TheRecordsNodeWinsOverAServerReportedFirst) {
  CulpritFinder f(true);
  f.Blame(kSchedulerRecord);
  EXPECT_FALSE(f.Certain().has_value()) << "worker 2's exit code may still come";
  f.ProcessFailed("scheduler (pid 1) exited with code 1", 1);
  f.FrontEndFailing(kServers);  // the servers' mpirun said it aborts first
  f.TaskFailed(kServers, "mpirun", Role::kServer, {1, 1, "exited with code 1"});
  EXPECT_FALSE(f.Certain().has_value());
  f.TaskFailed(kWorkers, "mpirun", Role::kWorker, {2, 9, "exited with code 9"});
  ASSERT_TRUE(f.Certain().has_value());
  EXPECT_EQ(f.Certain()->message, "worker 2 exited with code 9 (reported by mpirun)");
  EXPECT_EQ(f.Certain()->exit_code, 9);
}

TEST(CulpritFinder, WithoutTheToolsReportTheRecordsCauseIsNamed) {
  CulpritFinder f(true);
  f.Blame(kSchedulerRecord);
  f.TaskFailed(kWorkers, "mpirun", Role::kWorker, {0, 3, "exited with code 3"});
  EXPECT_FALSE(f.Certain().has_value());
  ASSERT_TRUE(f.Best().has_value());
  EXPECT_EQ(f.Best()->message,
            "worker 2 failed: its connection closed (the process exited or died) (reported by the "
            "scheduler)");
  EXPECT_EQ(f.Best()->exit_code, 3);
}

TEST(CulpritFinder, WithoutASchedulerTheFirstToolToFailNamesTheTask) {
  CulpritFinder f(false);
  f.FrontEndFailing(kWorkers);
  f.TaskFailed(kWorkers, "srun", Role::kWorker, {1, 137, "was killed by signal 9 (SIGKILL)"});
  ASSERT_TRUE(f.Certain().has_value());
  EXPECT_EQ(f.Certain()->message, "worker 1 was killed by signal 9 (SIGKILL) (reported by srun)");
  EXPECT_EQ(f.Certain()->exit_code, 137);
}

TEST(CulpritFinder, ATaskBeforeAProcessAndTheFirstProcessFailure) {
  CulpritFinder f(true);
  f.ProcessFailed("scheduler (pid 1) exited with code 1", 1);
  f.ProcessFailed("mpirun (servers, pid 2) exited with code 1", 1);
  EXPECT_EQ(f.Best()->message, "scheduler (pid 1) exited with code 1");
  f.TaskFailed(kServers, "mpirun", Role::kServer, {0, 4, "exited with code 4"});
  EXPECT_FALSE(f.Certain().has_value()) << "the scheduler may still name a node";
  EXPECT_EQ(f.Best()->message, "server 0 exited with code 4 (reported by mpirun)");
  EXPECT_EQ(f.Best()->exit_code, 4);
}

TEST(CulpritFinder, OnlyTheFirstFailureRecordCounts) {
  CulpritFinder f(true);
  f.Blame({{Role::kServer, 1}, "10.0.0.2", "no heartbeat for 15 s", "scheduler"});
  f.Blame(kSchedulerRecord);
  f.TaskFailed(kServers, "srun", Role::kServer, {1, 139, "was killed by signal 11 (SIGSEGV)"});
  ASSERT_TRUE(f.Certain().has_value());
  EXPECT_EQ(f.Certain()->message, "server 1 was killed by signal 11 (SIGSEGV) (reported by srun)");
}

}  // namespace
}  // namespace dtrain::launcher::testing

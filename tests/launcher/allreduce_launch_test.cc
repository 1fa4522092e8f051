// `dtrain launch -s 0` on this machine: an allreduce job of workers only, no scheduler or servers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "launch_test_support.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(AllreduceLaunch, StartsOnlyWorkersAndSucceedsWhenTheyDo) {
  LaunchProcess launch({"-n", "3", "-s", "0", "--", "sh", "-c",
                        "echo $DTRAIN_NODE_RANK $DMLC_ROLE $DMLC_NUM_WORKER $DMLC_NUM_SERVER "
                        "$DMLC_PS_ROOT_URI:$DMLC_PS_ROOT_PORT"});
  LaunchResult r = launch.Wait();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.err, m,
      std::regex(R"(dtrain launch: starting 3 workers on this machine \(allreduce job: no )"
                 R"(scheduler or servers; rendezvous at 127\.0\.0\.1:(\d+)\))")))
      << r.err;
  // Every worker finds worker 0 at the announced rendezvous.
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(r.out, HasSubstr("[worker " + std::to_string(i) + "] " + std::to_string(i) +
                                 " worker 3 0 127.0.0.1:" + m[1].str() + "\n"));
  }
  EXPECT_THAT(r.out + r.err, Not(HasSubstr("[scheduler]")));
  EXPECT_THAT(r.out + r.err, Not(HasSubstr("[server")));
  EXPECT_THAT(ProcessesWithEnv(launch.job_env()), IsEmpty());
}

TEST(AllreduceLaunch, AFailingWorkerStopsTheOthers) {
  LaunchProcess launch({"-n", "2", "-s", "0", "--kill-grace-ms", "1000", "--", "sh", "-c",
                        "if [ \"$DTRAIN_NODE_RANK\" = 1 ]; then exit 4; fi; sleep 1000"});
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(dtrain launch: worker 1 \(pid \d+\) exited with code 4; stopping)")))
      << r.err;
  EXPECT_THAT(ProcessesWithEnv(launch.job_env()), IsEmpty());
}

}  // namespace
}  // namespace dtrain::launcher::testing

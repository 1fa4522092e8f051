// Short commands run to their end before a job (ssh -G, rsync): output, codes, the deadline.
#include "launcher/run/setup_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

namespace dtrain::launcher {
namespace {

using ::testing::HasSubstr;

TEST(SetupCommands, RunTogetherAndReportOutputAndCodes) {
  std::vector<SetupResult> r = RunSetupCommands(
      {{"sh", "-c", "echo out; echo err >&2; exit 3"}, {"true"}, {"dtrain-no-such-program-y"}},
      Duration(20000));
  ASSERT_EQ(r.size(), 3u);
  EXPECT_FALSE(r[0].succeeded());
  EXPECT_EQ(r[0].status.ShellCode(), 3);
  EXPECT_THAT(r[0].output, HasSubstr("out\n"));
  EXPECT_THAT(r[0].output, HasSubstr("err\n"));
  EXPECT_THAT(r[0].Describe(Duration(1)), ::testing::MatchesRegex("exited with code 3: (out|err)"));
  EXPECT_TRUE(r[1].succeeded());
  EXPECT_EQ(r[2].status.ShellCode(), 127);
  EXPECT_THAT(r[2].output, HasSubstr("dtrain-no-such-program-y"));
}

TEST(SetupCommands, TheDeadlineKillsWhatIsLeft) {
  const auto start = std::chrono::steady_clock::now();
  // The grandchild holds the pipe too: the deadline must not wait for it either.
  std::vector<SetupResult> r =
      RunSetupCommands({{"sh", "-c", "sleep 100 & sleep 100"}, {"true"}}, Duration(300));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_TRUE(r[0].timed_out);
  EXPECT_EQ(r[0].Describe(Duration(300)), "did not finish within 300 ms");
  EXPECT_TRUE(r[1].succeeded());
}

}  // namespace
}  // namespace dtrain::launcher

// A node that announces an address the others cannot reach (a wrong DMLC_NODE_HOST, the wrong
// --interface) must make the job fail within DTRAIN_CONNECT_TIMEOUT_MS, with an error that names
// the node and the address, instead of hanging at start-up. This is the parameter-server core's
// doing; the launcher only has to pass it on. (ssh_launch_test.cc checks the same across hosts.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "launch_test_support.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::IsEmpty;

TEST(AnnouncedAddress, UnreachableWorkerAddressFailsTheJobNamingIt) {
  // Not an address of this machine: nothing there answers for worker 1 (a blackhole, a refusing
  // gateway or a proxy: each must end in a named error, not a hang).
  const std::string bad = "10.255.255.1";
  LaunchProcess launch({"-n", "2", "-s", "1", "--kill-grace-ms", "1000", "--env",
                        "DTRAIN_CONNECT_TIMEOUT_MS:3000", "--", "sh", "-c",
                        "if [ \"$DTRAIN_NODE_RANK\" = 1 ]; then export DMLC_NODE_HOST=" + bad +
                            "; fi; exec \"$0\" --scenario sync --rounds 5",
                        DTRAIN_BINARY_DIR "/tests/programs/kv_check_worker"});
  LaunchResult r = launch.Wait(std::chrono::seconds(90));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(worker 1 \(10\.255\.255\.1:\d+\).*(cannot reach|could not connect))")))
      << r.err;
  EXPECT_THAT(ProcessesWithEnv(launch.job_env()), IsEmpty());
}

}  // namespace
}  // namespace dtrain::launcher::testing

// The elastic job's host discovery script (run/host_discovery.h): real /bin/sh scripts.
#include "launcher/run/host_discovery.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "dtrain/common/error.h"

namespace dtrain::launcher {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::string& script, Duration deadline = Duration(5000)) {
  try {
    DiscoverHosts(script, deadline);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HostDiscovery, TheScriptsLinesAreHostsWithSlots) {
  const auto hosts = DiscoverHosts("printf 'node-a:2\\n# a comment\\nnode-b\\n'", Duration(5000));
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].host, "node-a");
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].host, "node-b");
  EXPECT_EQ(hosts[1].slots, 1);
}

TEST(HostDiscovery, NoOutputMeansNoHosts) {
  EXPECT_TRUE(DiscoverHosts("true", Duration(5000)).empty());
  EXPECT_TRUE(ParseDiscoveredHosts("\n  # nothing here\n").empty());
}

TEST(HostDiscovery, AFailingSlowOrMalformedScriptIsRefusedWithTheReason) {
  EXPECT_THAT(ErrorOf("exit 3"), HasSubstr("failed (exit code 3)"));
  EXPECT_THAT(ErrorOf("echo 'node-a slots=2'"), HasSubstr("is not a host"));
  EXPECT_THAT(ErrorOf("echo node-a:0"), HasSubstr("bad slot count"));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(ErrorOf("sleep 30", Duration(300)), HasSubstr("ran longer than"));
  // Stopped at its deadline, with its children (sleep is the shell's child here).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace dtrain::launcher

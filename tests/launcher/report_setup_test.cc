// The timeline `dtrain launch` merges (MergedTimelinePath): the file the processes write, by
// Config's rule (DTRAIN_TIMELINE, else HOROVOD_TIMELINE; NAME= is unset) applied to the
// environment they get, the launcher's with --env applied in order.
#include "launcher/status/report_setup.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace dtrain::launcher {
namespace {

using Env = std::map<std::string, std::string>;

std::string Merged(std::vector<EnvVar> env_all, Env launcher_env) {
  LaunchOptions options;
  options.env_all = std::move(env_all);
  return MergedTimelinePath(options, MapEnvironment(std::move(launcher_env)));
}

TEST(MergedTimelinePath, FromTheLauncherEnvironmentDtrainsElseHorovods) {
  EXPECT_EQ(Merged({}, {}), "");
  EXPECT_EQ(Merged({}, {{"HOROVOD_TIMELINE", "/tmp/h.json"}}), "/tmp/h.json");
  EXPECT_EQ(Merged({}, {{"DTRAIN_TIMELINE", "/tmp/d.json"}, {"HOROVOD_TIMELINE", "/tmp/h.json"}}),
            "/tmp/d.json");
  EXPECT_EQ(Merged({}, {{"DTRAIN_TIMELINE", ""}, {"HOROVOD_TIMELINE", "/tmp/h.json"}}),
            "/tmp/h.json");
}

TEST(MergedTimelinePath, EnvFlagsOverrideTheLauncherEnvironment) {
  EXPECT_EQ(Merged({{"DTRAIN_TIMELINE", "/tmp/flag.json"}}, {{"DTRAIN_TIMELINE", "/tmp/d.json"}}),
            "/tmp/flag.json");
  // The last --env of a name is the one the processes get.
  EXPECT_EQ(Merged({{"DTRAIN_TIMELINE", "/tmp/a.json"}, {"DTRAIN_TIMELINE", "/tmp/b.json"}}, {}),
            "/tmp/b.json");
}

TEST(MergedTimelinePath, DtrainsNameWinsWhicheverFlagComesFirst) {
  // The processes read DTRAIN_TIMELINE first, wherever each of the two was set.
  EXPECT_EQ(Merged({{"HOROVOD_TIMELINE", "/tmp/h.json"}, {"DTRAIN_TIMELINE", "/tmp/d.json"}}, {}),
            "/tmp/d.json");
  EXPECT_EQ(Merged({{"HOROVOD_TIMELINE", "/tmp/h.json"}}, {{"DTRAIN_TIMELINE", "/tmp/d.json"}}),
            "/tmp/d.json");
}

TEST(MergedTimelinePath, AnEmptyEnvFlagIsUnsetAsInTheProcesses) {
  // --env DTRAIN_TIMELINE: leaves the processes on HOROVOD_TIMELINE, and the launcher merges it.
  EXPECT_EQ(Merged({{"DTRAIN_TIMELINE", ""}}, {{"HOROVOD_TIMELINE", "/tmp/h.json"}}),
            "/tmp/h.json");
  EXPECT_EQ(Merged({{"DTRAIN_TIMELINE", ""}}, {{"DTRAIN_TIMELINE", "/tmp/d.json"}}), "");
}

}  // namespace
}  // namespace dtrain::launcher

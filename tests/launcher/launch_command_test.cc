// What `dtrain launch` sets in its own environment for a job (PlanLaunchVariables), decided from
// the options and the launcher's environment with the configuration reader's rule: NAME= counts as
// unset, as it does in every process of the job.
#include "launcher/run/launch_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "dtrain/common/error.h"

namespace dtrain::launcher {
namespace {

using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

constexpr char kSecret[] = "sixteen-chars-ok";

LaunchOptions WithRestarts(int max_restarts, int num_servers = 1) {
  LaunchOptions o;
  o.num_workers = 2;
  o.num_servers = num_servers;
  o.max_restarts = max_restarts;
  o.worker_command = {"true"};
  return o;
}

LaunchVariables Plan(const LaunchOptions& options, Env env) {
  // A secret of the user's, so that each test sees only what it varies.
  env.emplace("DTRAIN_JOB_SECRET", kSecret);
  return PlanLaunchVariables(options, EnvReader(MapEnvironment(env)));
}

TEST(LaunchVariables, RestartsWaitAMinuteForAReplacementUnlessTheUserChose) {
  EXPECT_EQ(Plan(WithRestarts(2), {}).restart_wait_ms, std::optional<std::string>("60000"));
  EXPECT_EQ(Plan(WithRestarts(2), {{"DTRAIN_RESTART_WAIT_MS", "5000"}}).restart_wait_ms,
            std::nullopt);
  // 0 is a choice too: a lost worker fails the job (replacements are started all the same).
  EXPECT_EQ(Plan(WithRestarts(2), {{"DTRAIN_RESTART_WAIT_MS", "0"}}).restart_wait_ms, std::nullopt);
  EXPECT_EQ(Plan(WithRestarts(0), {}).restart_wait_ms, std::nullopt);
}

TEST(LaunchVariables, AnEmptyRestartWaitIsUnsetSoRestartsGetTheDefault) {
  // Every process reads DTRAIN_RESTART_WAIT_MS= as unset, i.e. 0: no wait at all. Leaving it
  // alone would make --max-restarts replace nobody in time.
  EXPECT_EQ(Plan(WithRestarts(2), {{"DTRAIN_RESTART_WAIT_MS", ""}}).restart_wait_ms,
            std::optional<std::string>("60000"));
}

TEST(LaunchVariables, RestartsWithServersGetAFreshCheckpointDirUnlessTheUserChose) {
  EXPECT_TRUE(Plan(WithRestarts(1), {}).new_checkpoint_dir);
  EXPECT_FALSE(Plan(WithRestarts(1), {{"DTRAIN_CHECKPOINT_DIR", "/data/ckpt"}}).new_checkpoint_dir);
  EXPECT_FALSE(Plan(WithRestarts(0), {}).new_checkpoint_dir);
  EXPECT_FALSE(Plan(WithRestarts(1, /*num_servers=*/0), {}).new_checkpoint_dir);
}

TEST(LaunchVariables, AnEmptyCheckpointDirIsUnsetSoRestartsGetAFreshOne) {
  // The servers read DTRAIN_CHECKPOINT_DIR= as unset: no checkpoints, so no server replacement.
  EXPECT_TRUE(Plan(WithRestarts(1), {{"DTRAIN_CHECKPOINT_DIR", ""}}).new_checkpoint_dir);
}

TEST(LaunchVariables, AJobGetsAFreshSecretUnlessTheUserSetOne) {
  EXPECT_TRUE(PlanLaunchVariables(WithRestarts(0), EnvReader(MapEnvironment({}))).new_job_secret);
  EXPECT_FALSE(Plan(WithRestarts(0), {}).new_job_secret);
}

TEST(LaunchVariables, ASecretSetButEmptyOrShortIsRefusedBeforeAnythingStarts) {
  // The one exception to NAME= meaning unset, in the launcher as in every process
  // (JobSecretFromVariable): a job without a secret admits anybody who reaches its ports.
  for (const char* value : {"", "short"}) {
    try {
      PlanLaunchVariables(WithRestarts(0),
                          EnvReader(MapEnvironment({{"DTRAIN_JOB_SECRET", value}})));
      ADD_FAILURE() << "DTRAIN_JOB_SECRET='" << value << "' was accepted";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr("DTRAIN_JOB_SECRET is"));
    }
  }
}

}  // namespace
}  // namespace dtrain::launcher

#include "launcher/plan/forwarded_env.h"

#include <gtest/gtest.h>

namespace dtrain::launcher {
namespace {

TEST(ForwardedEnv, TheJobSecretGoesToClusterToolsButNeverOntoAnSshCommandLine) {
  EXPECT_TRUE(IsForwarded("DTRAIN_JOB_SECRET", RemoteStart::kClusterTool));
  EXPECT_FALSE(IsForwarded("DTRAIN_JOB_SECRET", RemoteStart::kSsh));
  EXPECT_TRUE(IsForwarded("DTRAIN_HELLO_TIMEOUT_MS", RemoteStart::kSsh));
  EXPECT_FALSE(IsForwarded("DMLC_NODE_HOST", RemoteStart::kClusterTool));
}

}  // namespace
}  // namespace dtrain::launcher

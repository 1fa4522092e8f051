// A process in a Kubernetes pod: Kubeflow MXJob's MX_CONFIG where the plain variables are unset,
// and connect and start deadlines that wait for pods.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/config/config.h"
#include "common/config/operator_env.h"
#include "dtrain/common/error.h"

namespace dtrain {
namespace {

using Env = std::map<std::string, std::string>;

Config Parse(const Env& env) { return Config::FromEnvironment(MapEnvironment(env)); }

// As the training operator writes it for worker 1 of a 2-server, 3-worker MXJob "demo".
const char* const kMxConfig =
    R"({"cluster":{"scheduler":[{"url":"demo-scheduler-0","port":9091}],)"
    R"("server":[{"url":"demo-server-0","port":9091},{"url":"demo-server-1","port":9091}],)"
    R"("worker":[{"url":"demo-worker-0","port":9091},{"url":"demo-worker-1","port":9091},)"
    R"({"url":"demo-worker-2","port":9091}]},"labels":{"scheduler":"","server":"","worker":""},)"
    R"("task":{"type":"worker","index":1}})";

TEST(KubernetesConfig, MxConfigAloneGivesTheJobsLayout) {
  const Config c = Parse({{"MX_CONFIG", kMxConfig}});
  ASSERT_TRUE(c.role.has_value());
  EXPECT_EQ(*c.role, Role::kWorker);
  EXPECT_EQ(c.scheduler_host, "demo-scheduler-0");
  EXPECT_EQ(c.scheduler_port, 9091);
  EXPECT_EQ(c.num_servers, 2);
  EXPECT_EQ(c.num_workers, 3);
}

TEST(KubernetesConfig, ThePlainVariablesWinOverMxConfig) {
  const Config c = Parse({{"MX_CONFIG", kMxConfig}, {"DMLC_PS_ROOT_PORT", "9000"}});
  EXPECT_EQ(c.scheduler_port, 9000);
  EXPECT_EQ(c.num_workers, 3);
}

TEST(KubernetesConfig, AMalformedMxConfigIsNamed) {
  for (const char* bad :
       {"{", "[1]", R"({"cluster":{"scheduler":[{"url":1}]}})", R"({"task":{"index":0}})"}) {
    try {
      Parse({{"MX_CONFIG", bad}});
      ADD_FAILURE() << "no error for " << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("MX_CONFIG"), std::string::npos) << e.what();
    }
  }
}

TEST(KubernetesConfig, APodsDeadlinesWaitForPodsUnlessSet) {
  const Config plain = Parse({});
  EXPECT_EQ(plain.connect_timeout, Duration(30000));
  EXPECT_EQ(plain.start_timeout, Duration(120000));
  for (const Env& pod :
       {Env{{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}}, Env{{"DMLC_USE_KUBERNETES", "1"}}}) {
    const Config c = Parse(pod);
    EXPECT_EQ(c.connect_timeout, Config::kPodConnectTimeout);
    EXPECT_EQ(c.start_timeout, Config::kPodStartTimeout);
  }
  const Config set =
      Parse({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"DTRAIN_CONNECT_TIMEOUT_MS", "5000"}});
  EXPECT_EQ(set.connect_timeout, Duration(5000));
}

// PyTorchJob's pods (torchrun's variables): an allreduce job meeting at MASTER_ADDR:MASTER_PORT.
TEST(KubernetesConfig, TorchrunsVariablesGiveAnAllreduceLayout) {
  const Config c = Parse({{"MASTER_ADDR", "demo-master-0"},
                          {"MASTER_PORT", "23456"},
                          {"WORLD_SIZE", "4"},
                          {"RANK", "2"},
                          {"LOCAL_RANK", "0"}});
  EXPECT_EQ(c.scheduler_host, "demo-master-0");
  EXPECT_EQ(c.scheduler_port, 23456);
  EXPECT_EQ(c.num_workers, 4);
  EXPECT_EQ(c.num_servers, 0);
  EXPECT_EQ(c.requested_rank, 2);
  // Not all four: nothing taken from them (a script's own MASTER_ADDR stays its own).
  EXPECT_EQ(Parse({{"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}}).scheduler_host, "");
  // dtrain's own variables win.
  EXPECT_EQ(Parse({{"MASTER_ADDR", "x"},
                   {"MASTER_PORT", "1"},
                   {"WORLD_SIZE", "2"},
                   {"RANK", "0"},
                   {"DMLC_PS_ROOT_URI", "y"}})
                .scheduler_host,
            "y");
}

}  // namespace
}  // namespace dtrain

// Which processes a job has and what each is given; pure, no processes start.
#include "launcher/job_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace dtrain::launcher {
namespace {

using ::testing::ElementsAre;

// The environment a process ends up with: later entries win, as in the child.
std::map<std::string, std::string> EnvOf(const ProcessSpec& spec) {
  std::map<std::string, std::string> env;
  for (const auto& [name, value] : spec.env) env[name] = value;
  return env;
}

JobPlan SamplePlan() {
  LaunchOptions o;
  o.num_workers = 3;
  o.num_servers = 2;
  o.env_all = {{"A", "all"}, {"DMLC_NODE_HOST", "10.0.0.7"}};
  o.env_server = {{"S", "server-only"}, {"A", "server wins"}};
  o.env_worker = {{"W", "worker-only"}};
  o.worker_command = {"python", "train.py"};
  return BuildJobPlan(o, PlaceLocally(2, 3), "/opt/dtrain", 4321);
}

TEST(JobPlan, SchedulerFirstThenServersThenWorkers) {
  JobPlan plan = SamplePlan();
  ASSERT_EQ(plan.processes.size(), 6u);
  std::vector<std::string> names;
  for (const ProcessSpec& p : plan.processes) names.push_back(p.Name());
  EXPECT_THAT(names,
              ElementsAre("scheduler", "server 0", "server 1", "worker 0", "worker 1", "worker 2"));
  EXPECT_THAT(plan.processes[0].argv, ElementsAre("/opt/dtrain", "scheduler"));
  EXPECT_THAT(plan.processes[2].argv, ElementsAre("/opt/dtrain", "server"));
  EXPECT_THAT(plan.processes[5].argv, ElementsAre("python", "train.py"));
  EXPECT_EQ(plan.processes[0].LogFileName(), "scheduler.log");
  EXPECT_EQ(plan.processes[2].LogFileName(), "server-1.log");
  EXPECT_EQ(plan.processes[3].LogFileName(), "worker-0.log");
  for (const ProcessSpec& p : plan.processes) EXPECT_EQ(p.host, "127.0.0.1");
}

TEST(JobPlan, EveryProcessGetsTheJobLayout) {
  JobPlan plan = SamplePlan();
  for (const ProcessSpec& p : plan.processes) {
    auto env = EnvOf(p);
    EXPECT_EQ(env["DMLC_ROLE"], RoleName(p.role));
    EXPECT_EQ(env["DMLC_PS_ROOT_URI"], "127.0.0.1");
    EXPECT_EQ(env["DMLC_PS_ROOT_PORT"], "4321");
    EXPECT_EQ(env["DMLC_NUM_SERVER"], "2");
    EXPECT_EQ(env["DMLC_NUM_WORKER"], "3");
    // A user value for a variable the launcher does not own wins.
    EXPECT_EQ(env["DMLC_NODE_HOST"], "10.0.0.7");
    if (p.role == Role::kScheduler) {
      EXPECT_EQ(env.count("DTRAIN_NODE_RANK"), 0u);
    } else {
      EXPECT_EQ(env["DTRAIN_NODE_RANK"], std::to_string(p.rank));
    }
  }
}

TEST(JobPlan, RoleSpecificVariables) {
  JobPlan plan = SamplePlan();
  auto scheduler = EnvOf(plan.processes[0]);
  auto server = EnvOf(plan.processes[1]);
  auto worker = EnvOf(plan.processes[3]);
  EXPECT_EQ(scheduler["A"], "all");
  EXPECT_EQ(scheduler.count("S") + scheduler.count("W"), 0u);
  EXPECT_EQ(server["A"], "server wins");
  EXPECT_EQ(server["S"], "server-only");
  EXPECT_EQ(server.count("W"), 0u);
  EXPECT_EQ(worker["A"], "all");
  EXPECT_EQ(worker["W"], "worker-only");
  EXPECT_EQ(worker.count("S"), 0u);
}

}  // namespace
}  // namespace dtrain::launcher

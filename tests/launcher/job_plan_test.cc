// Which processes a job has and what each is given; pure, no processes start.
#include "launcher/plan/job_plan.h"

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

TEST(JobPlan, ParameterServerJobsGetNoHorovodVariables) {
  for (const ProcessSpec& p : SamplePlan().processes) {
    EXPECT_EQ(EnvOf(p).count("HOROVOD_RANK"), 0u) << p.Name();
  }
  EXPECT_TRUE(IsPerRankVariable("HOROVOD_LOCAL_RANK"));
  EXPECT_FALSE(IsPerRankVariable("HOROVOD_FUSION_THRESHOLD"));
}

std::vector<HostEntry> Hosts(std::vector<std::string> names) {
  std::vector<HostEntry> out;
  for (auto& n : names) out.push_back({n, 1});
  return out;
}

// `import dtrain` divides the host's cores among its workers: every worker learns how many share
// its host, in a parameter-server job too (servers do not count, nor do other hosts' workers).
TEST(JobPlan, EveryWorkerLearnsHowManyWorkersShareItsHost) {
  LaunchOptions o;
  o.num_workers = 3;
  o.num_servers = 1;
  o.worker_command = {"train"};
  JobPlan plan =
      BuildJobPlan(o, PlaceOnHosts(Hosts({"a", "b"}), 1, 3, "10.0.0.1"), "/opt/dtrain", 5555);
  std::vector<std::string> workers_here;
  for (const ProcessSpec& p : plan.processes) {
    auto env = EnvOf(p);
    if (p.role != Role::kWorker) {
      EXPECT_EQ(env.count("DTRAIN_LOCAL_WORKERS"), 0u) << p.Name();
      continue;
    }
    workers_here.push_back(p.host + ":" + env["DTRAIN_LOCAL_WORKERS"]);
  }
  // The server takes host a's first slot, then workers b, a, b.
  EXPECT_THAT(workers_here, ElementsAre("b:2", "a:1", "b:2"));
  EXPECT_TRUE(IsPerRankVariable("DTRAIN_LOCAL_WORKERS"));
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

// The seeds' example: 5 hosts, 3 servers and 3 workers; servers on the first three hosts,
// workers on the fourth, fifth and first.
TEST(PlaceOnHosts, CyclesServersThenWorkersThroughTheHosts) {
  Placement p = PlaceOnHosts(Hosts({"h1", "h2", "h3", "h4", "h5"}), 3, 3, "10.0.0.100");
  EXPECT_EQ(p.scheduler_host, "10.0.0.100");
  EXPECT_THAT(p.server_hosts, ElementsAre("h1", "h2", "h3"));
  EXPECT_THAT(p.worker_hosts, ElementsAre("h4", "h5", "h1"));
}

TEST(PlaceOnHosts, ExactlyNHostsGetOneServerAndOneWorkerEach) {
  Placement p = PlaceOnHosts(Hosts({"a", "b", "c"}), 3, 3, "x");
  EXPECT_THAT(p.server_hosts, ElementsAre("a", "b", "c"));
  EXPECT_THAT(p.worker_hosts, ElementsAre("a", "b", "c"));
}

TEST(PlaceOnHosts, FewerHostsWrapAround) {
  Placement p = PlaceOnHosts(Hosts({"a", "b"}), 1, 4, "x");
  EXPECT_THAT(p.server_hosts, ElementsAre("a"));
  EXPECT_THAT(p.worker_hosts, ElementsAre("b", "a", "b", "a"));
}

TEST(PlaceOnHosts, NoServers) {
  Placement p = PlaceOnHosts(Hosts({"a", "b"}), 0, 3, "x");
  EXPECT_TRUE(p.server_hosts.empty());
  EXPECT_THAT(p.worker_hosts, ElementsAre("a", "b", "a"));
}

// A host with SLOTS takes that many consecutive processes per round, as mpirun fills slots.
TEST(PlaceOnHosts, SlotsFillAHostBeforeTheNext) {
  Placement p = PlaceOnHosts({{"a", 2}, {"b", 1}}, 2, 3, "x");
  EXPECT_THAT(p.server_hosts, ElementsAre("a", "a"));
  EXPECT_THAT(p.worker_hosts, ElementsAre("b", "a", "a"));
}

TEST(PlaceOnHosts, NoHostsIsAUsageError) { EXPECT_THROW(PlaceOnHosts({}, 1, 1, "x"), UsageError); }

// -s 0: workers only; they rendezvous with worker 0, which hosts the collectives' store.
TEST(JobPlan, AllreduceJobHasOnlyWorkers) {
  LaunchOptions o;
  o.num_workers = 3;
  o.num_servers = 0;
  o.worker_command = {"train"};
  Placement placement = PlaceOnHosts({{"alice@a", 1}, {"b", 1}}, 0, 3, "10.0.0.100");
  placement.addresses["alice@a"] = "10.0.0.1";
  JobPlan plan = BuildJobPlan(o, placement, "/opt/dtrain", 5555);
  EXPECT_EQ(plan.num_servers, 0);
  EXPECT_EQ(plan.scheduler_host, "10.0.0.1");
  ASSERT_EQ(plan.processes.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const ProcessSpec& p = plan.processes[i];
    EXPECT_EQ(p.role, Role::kWorker);
    EXPECT_EQ(p.rank, i);
    auto env = EnvOf(p);
    EXPECT_EQ(env["DMLC_ROLE"], "worker");
    EXPECT_EQ(env["DMLC_PS_ROOT_URI"], "10.0.0.1");
    EXPECT_EQ(env["DMLC_PS_ROOT_PORT"], "5555");
    EXPECT_EQ(env["DMLC_NUM_SERVER"], "0");
    EXPECT_EQ(env["DMLC_NUM_WORKER"], "3");
    EXPECT_EQ(env["DTRAIN_NODE_RANK"], std::to_string(i));
  }
  EXPECT_THAT(std::vector<std::string>(
                  {plan.processes[0].host, plan.processes[1].host, plan.processes[2].host}),
              ElementsAre("alice@a", "b", "alice@a"));
  EXPECT_EQ(EnvOf(plan.processes[1])["DMLC_NODE_HOST"], "b");
  EXPECT_EQ(EnvOf(plan.processes[2])["DMLC_NODE_HOST"], "10.0.0.1");
  // horovodrun's variables: ranks 0 and 2 share host a (local ranks 0 and 1), rank 1 is alone on
  // b; local rank 0 exists on both hosts (cross size 2), local rank 1 only on a.
  const char* names[] = {"HOROVOD_RANK",       "HOROVOD_SIZE",       "HOROVOD_LOCAL_RANK",
                         "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"};
  const std::vector<std::vector<std::string>> want = {{"0", "3", "0", "2", "0", "2"},
                                                      {"1", "3", "0", "1", "1", "2"},
                                                      {"2", "3", "1", "2", "0", "1"}};
  for (int i = 0; i < 3; ++i) {
    auto env = EnvOf(plan.processes[i]);
    for (int v = 0; v < 6; ++v)
      EXPECT_EQ(env[names[v]], want[i][v]) << "rank " << i << " " << names[v];
  }
}

TEST(JobPlan, AllreduceJobLocally) {
  LaunchOptions o;
  o.num_workers = 2;
  o.num_servers = 0;
  o.worker_command = {"train"};
  JobPlan plan = BuildJobPlan(o, PlaceLocally(0, 2), "/opt/dtrain", 5555);
  ASSERT_EQ(plan.processes.size(), 2u);
  EXPECT_EQ(EnvOf(plan.processes[0])["DMLC_PS_ROOT_URI"], "127.0.0.1");
  EXPECT_EQ(EnvOf(plan.processes[1])["DMLC_NODE_HOST"], "127.0.0.1");
}

// Each node announces its host's address as the others reach it (not the ssh destination).
TEST(JobPlan, NodesAnnounceTheirHostsAddress) {
  LaunchOptions o;
  o.num_workers = 2;
  o.num_servers = 2;
  o.worker_command = {"train"};
  Placement placement = PlaceOnHosts({{"root@node-a", 1}, {"10.0.0.2", 1}}, 2, 2, "10.0.0.100");
  placement.addresses["root@node-a"] = "node-a";
  JobPlan plan = BuildJobPlan(o, placement, "/opt/dtrain", 4000);
  std::vector<std::string> announced;
  for (const ProcessSpec& p : plan.processes) announced.push_back(EnvOf(p)["DMLC_NODE_HOST"]);
  EXPECT_THAT(announced, ElementsAre("10.0.0.100", "node-a", "10.0.0.2", "node-a", "10.0.0.2"));
  EXPECT_EQ(plan.processes[0].host, "10.0.0.100");
  EXPECT_EQ(plan.processes[1].host, "root@node-a");
  EXPECT_EQ(EnvOf(plan.processes[3])["DMLC_PS_ROOT_URI"], "10.0.0.100");
}

// --interface: DMLC_INTERFACE everywhere and no DMLC_NODE_HOST, which the node would prefer; a
// user's --env DMLC_NODE_HOST still wins.
TEST(JobPlan, InterfaceReplacesTheAnnouncedAddress) {
  LaunchOptions o;
  o.num_workers = 1;
  o.num_servers = 1;
  o.interface = "eth1";
  o.worker_command = {"train"};
  o.env_worker = {{"DMLC_NODE_HOST", "192.0.2.7"}};
  JobPlan plan = BuildJobPlan(o, PlaceOnHosts({{"a", 1}}, 1, 1, "10.0.0.100"), "/opt/dtrain", 1);
  for (const ProcessSpec& p : plan.processes) {
    auto env = EnvOf(p);
    EXPECT_EQ(env["DMLC_INTERFACE"], "eth1") << p.Name();
    if (p.role == Role::kWorker) {
      EXPECT_EQ(env["DMLC_NODE_HOST"], "192.0.2.7");
    } else {
      EXPECT_EQ(env.count("DMLC_NODE_HOST"), 0u) << p.Name();
    }
  }
}

}  // namespace
}  // namespace dtrain::launcher

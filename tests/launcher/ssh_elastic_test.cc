// An elastic allreduce job over ssh (`dtrain launch --launcher ssh -s 0 --host-discovery-script`)
// on three "hosts" (network namespaces with their own sshd, ssh_test_cluster.h), as Horovod's
// elastic users run one: tests/python/programs/elastic_worker.py (hvd.elastic.run, TorchState,
// ElasticSampler) on each host. A host's worker is killed mid-epoch: the other two go on from
// their last commit; the discovery script drops the host and offers it again: a new worker starts
// there and the job has 3 ranks again; every rank ends with the same weights.
//
// Skipped, with the reason, where namespaces cannot be made or python3 cannot import torch and
// the built dtrain package.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "launch_test_support.h"
#include "ssh_test_cluster.h"

namespace dtrain::launcher::testing {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

const std::string kPythonPath = DTRAIN_BINARY_DIR "/python";
const std::string kWorker = DTRAIN_SOURCE_DIR "/tests/python/programs/elastic_worker.py";

// The absolute path of the python3 on this process's PATH ("" if none). The "hosts" are this
// machine's namespaces, but their ssh sessions start the login shell, whose rc files may put
// another python3 first (pyenv's shims, without torch): the workers run the one probed here.
std::string Python3() {
  std::string path;
  if (FILE* f = popen("command -v python3", "r")) {
    char line[4096];
    if (fgets(line, sizeof line, f) != nullptr) path = line;
    pclose(f);
  }
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  return path;
}

// The workers' events (elastic_worker.py writes DIR/events-<pid>.jsonl), every complete line.
std::vector<Json> Events(const TempDir& dir) {
  std::vector<Json> events;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events-", 0) != 0) continue;
    const std::string text = ReadFile(entry.path());
    size_t start = 0;
    for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
      events.push_back(Json::parse(text.substr(start, end - start)));
    }
  }
  return events;
}

// Steps taken with `size` ranks after `after` (seconds since the epoch, as the events say).
std::vector<Json> StepsOfSize(const TempDir& dir, int size, double after) {
  std::vector<Json> steps;
  for (Json& e : Events(dir)) {
    if (e["kind"] == "step" && e["size"] == size && e["t"].get<double>() > after) {
      steps.push_back(std::move(e));
    }
  }
  return steps;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The network namespace `pid` runs in, by name (`ip netns identify`), or "".
std::string NetnsOf(pid_t pid) {
  const std::string command = "ip netns identify " + std::to_string(pid) + " 2>/dev/null";
  std::FILE* f = ::popen(command.c_str(), "r");
  if (f == nullptr) return "";
  char line[256] = {};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  ::pclose(f);
  std::string name = got ? line : "";
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

class SshElastic : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::optional<std::string> why = SshTestCluster::WhyUnavailable()) {
      GTEST_SKIP() << "no ssh test cluster here: " << *why;
    }
    python_ = Python3();
    if (python_.empty()) GTEST_SKIP() << "no python3 on PATH";
    const std::string probe = "PYTHONPATH=" + kPythonPath + " " + python_ +
                              " -c 'import torch, dtrain.torch' >/dev/null 2>&1";
    if (std::system(probe.c_str()) != 0) {
      GTEST_SKIP() << python_ << " cannot import torch and dtrain.torch from " << kPythonPath;
    }
    cluster_ = std::make_unique<SshTestCluster>(3);
  }

  std::string HostLines(const std::vector<int>& hosts) const {
    std::string text;
    for (int i : hosts) text += cluster_->address(i) + ":1\n";
    return text;
  }

  // Waits until `count` steps of `size` ranks were taken after `after`; fails the test (and
  // returns none) when the launcher exits first or after `timeout`.
  std::vector<Json> WaitForSteps(LaunchProcess& launch, const TempDir& dir, int size, size_t count,
                                 double after, std::chrono::seconds timeout) {
    std::vector<Json> steps;
    const bool ok = PollUntil(
        [&] {
          steps = StepsOfSize(dir, size, after);
          return steps.size() >= count || !IsRunning(launch.pid());
        },
        timeout);
    if (!ok || steps.size() < count) {
      LaunchResult r = launch.Wait(std::chrono::seconds(1));
      ADD_FAILURE() << "no " << count << " steps of " << size << " ranks:\n" << r.err << r.out;
      return {};
    }
    return steps;
  }

  std::unique_ptr<SshTestCluster> cluster_;
  std::string python_;  // the interpreter the workers run (Python3())
};

TEST_F(SshElastic, AKilledHostsWorkerLeavesTwoRanksAndTheHostOfferedAgainMakesThree) {
  TempDir dir;
  const std::string hosts = dir / "hosts";
  WriteText(hosts, HostLines({0, 1, 2}));
  LaunchProcess launch({"--launcher",
                        "ssh",
                        "--ssh-opts",
                        cluster_->ssh_opts(),
                        "-s",
                        "0",
                        "--host-discovery-script",
                        "cat " + hosts,
                        "--min-np",
                        "2",
                        "--max-np",
                        "3",
                        "--elastic-timeout",
                        "60",
                        "--kill-grace-ms",
                        "1000",
                        "--env",
                        "PYTHONPATH:" + kPythonPath,
                        "--env",
                        "ELASTIC_LOG_DIR:" + dir.path().string(),
                        "--",
                        python_,
                        kWorker,
                        "0.05"});

  const std::vector<Json> first = WaitForSteps(launch, dir, 3, 30, 0, std::chrono::seconds(120));
  ASSERT_FALSE(first.empty());
  // Worker i took host i's slot (workers start in the script's order) and runs there.
  pid_t victim = 0;
  for (const Json& e : first) {
    const int worker = e["worker"].get<int>();
    ASSERT_LT(worker, 3);
    EXPECT_EQ(NetnsOf(e["pid"].get<pid_t>()), cluster_->netns(worker)) << e;
    if (worker == 2) victim = e["pid"].get<pid_t>();
  }
  ASSERT_NE(victim, 0);
  const double killed_at = Now();
  ASSERT_EQ(cluster_->RunIn(2, {"kill", "-9", std::to_string(victim)}), 0);

  const std::vector<Json> two =
      WaitForSteps(launch, dir, 2, 10, killed_at, std::chrono::seconds(60));
  ASSERT_FALSE(two.empty());
  for (const Json& e : two) EXPECT_NE(e["pid"].get<pid_t>(), victim);
  // They went back to their last commit (every 4 batches, and at each epoch's end).
  EXPECT_EQ((two.front()["batch"].get<int>() - 1) % 4, 0) << two.front();

  // The script drops host 2, then offers it again: its retired slot counts afresh.
  WriteText(hosts, HostLines({0, 1}));
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const double offered_at = Now();
  WriteText(hosts, HostLines({0, 1, 2}));
  const std::vector<Json> again =
      WaitForSteps(launch, dir, 3, 60, offered_at, std::chrono::seconds(120));
  ASSERT_FALSE(again.empty());
  std::set<pid_t> pids;
  for (const Json& e : again) {
    pids.insert(e["pid"].get<pid_t>());
    if (e["worker"] == 3) {
      EXPECT_EQ(NetnsOf(e["pid"].get<pid_t>()), cluster_->netns(2)) << e;
    }
  }
  EXPECT_EQ(pids.size(), 3u);
  EXPECT_EQ(pids.count(victim), 0u);

  WriteText(dir / "stop", "");
  LaunchResult r = launch.Wait(std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  // What the launcher said, for the test's log.
  for (const std::string& line : SplitLines(r.err)) {
    if (line.rfind("dtrain launch:", 0) == 0) std::printf("[ launcher ] %s\n", line.c_str());
  }
  const std::string a2 = cluster_->address(2);
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("dtrain launch: worker 2 on " + a2 +
                        R"( \(ssh pid \d+\) exited with code 137: the remote process was killed )"
                        R"(by signal 9 \(SIGKILL\); its slot on )" +
                        a2 + " is retired and the other 2 go on")))
      << r.err;
  EXPECT_THAT(r.err, HasSubstr("starting worker 3 on a free slot of " + a2));
  EXPECT_THAT(r.err, HasSubstr("3 rank(s): worker 0, worker 1, worker 3"));

  std::vector<Json> finals;
  for (Json& e : Events(dir)) {
    if (e["kind"] == "final") finals.push_back(std::move(e));
  }
  ASSERT_EQ(finals.size(), 3u) << r.err;
  // The newcomer got rank 0's weights and every step since was averaged over all three.
  for (const Json& f : finals) EXPECT_EQ(f["weights"], finals[0]["weights"]);
  const std::vector<double> truth = {1.0, -2.0, 3.0, 0.5};
  for (size_t i = 0; i < truth.size(); ++i) {
    EXPECT_NEAR(finals[0]["weights"][i].get<double>(), truth[i], 0.1);
  }
  EXPECT_TRUE(PollUntil([&] { return ProcessesWithEnv(launch.job_env()).empty(); },
                        std::chrono::seconds(20)));
}

}  // namespace
}  // namespace dtrain::launcher::testing

// The training front end end to end, as real processes: exactness of distributed SGD against one
// worker, convergence on the real Fashion-MNIST, and dtrain-train's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>

#include "subprocess.h"
#include "train_results.h"

namespace dtrain::testing {
namespace {

constexpr int kHangGuardMs = 600000;

// Runs `argv`, directly or under `dtrain launch -n workers -s workers`, and expects success.
std::string RunJob(int workers, std::vector<std::string> argv, const std::string& log) {
  if (workers > 0) {
    std::vector<std::string> launch = {BinaryPath("src/tools/dtrain"),
                                       "launch",
                                       "-n",
                                       std::to_string(workers),
                                       "--launcher",
                                       "local",
                                       "--"};
    argv.insert(argv.begin(), launch.begin(), launch.end());
  }
  Subprocess p(argv, {}, log);
  auto code = p.Wait(kHangGuardMs);
  EXPECT_TRUE(code.has_value()) << "hung: " << p.Output();
  EXPECT_EQ(code.value_or(-1), 0) << p.Output();
  return p.Output();
}

class Exactness : public ::testing::Test {
 protected:
  std::string Run(int workers, std::vector<std::string> extra) {
    const std::string out = dir.path() + "/params" + std::to_string(runs++) + ".bin";
    RunJob(workers, ExactnessArgs(out, std::move(extra)), out + ".log");
    return out;
  }
  void ExpectSame(const std::string& a, const std::string& b) { ExpectSameParameters(a, b); }
  TempDir dir;
  int runs = 0;
};

TEST_F(Exactness, TwoWorkersWithHalfBatchesMatchOneWorkerWithTheWholeBatch) {
  const std::string one = Run(0, {"--kvstore", "local"});
  ExpectSame(one, Run(2, {"--kvstore", "dist_sync"}));
  ExpectSame(one, Run(2, {"--kvstore", "dist_sync", "--update-on-kvstore", "false"}));
  ExpectSame(one, Run(2, {"--kvstore", "dist_sync", "--overlap", "false"}));
}

TEST_F(Exactness, TwoLocalDevicesMatchOne) {
  const std::string one = Run(0, {"--kvstore", "local"});
  ExpectSame(one, Run(0, {"--kvstore", "device", "--devices", "2"}));
  ExpectSame(one, Run(0, {"--kvstore", "local", "--devices", "2", "--update-on-kvstore", "false"}));
  ExpectSame(one, Run(2, {"--kvstore", "dist_sync", "--devices", "2"}));
}

TEST_F(Exactness, FusingSmallParametersChangesNothing) {
  const std::string one = Run(0, {"--kvstore", "local", "--fuse-below-kb", "0"});
  ExpectSame(one, Run(0, {"--kvstore", "local", "--fuse-below-kb", "1024"}));
  ExpectSame(one, Run(2, {"--kvstore", "dist_sync", "--fuse-below-kb", "0"}));
  ExpectSame(one, Run(2, {"--kvstore", "dist_sync", "--fuse-below-kb", "1024",
                          "--update-on-kvstore", "false"}));
}

TEST_F(Exactness, UpdateOnKvstoreOrNotGiveTheSameResult) {
  ExpectSame(Run(0, {"--kvstore", "local", "--update-on-kvstore", "true"}),
             Run(0, {"--kvstore", "local", "--update-on-kvstore", "false"}));
}

TEST(Convergence, LeNetOnFashionMnistWithTwoWorkersDistSync) {
  TempDir dir;
  const std::string out =
      RunJob(2,
             {BinaryPath("src/train/dtrain-train"), "--dataset", "fashion-mnist", "--network",
              "lenet", "--kvstore", "dist_sync", "--epochs", "2", "--log-interval", "0"},
             dir.path() + "/log");
  // The floor of a run on any machine, not of this seed here: seed 42 gives 0.8879 on a 2-core
  // machine, but the trajectory moves with the thread count and the CPU's kernels as it does with
  // the seed (seeds 1, 2, 3, 7, 8: 0.8826, 0.8817, 0.8813, 0.8752-0.8794, 0.8711; docs/performance.md,
  // docs/reliability.md). A point under the worst of them; a model that does not learn or diverges
  // lands far below.
  EXPECT_GE(LastTestAccuracy(out), 0.86) << out;
}

TEST(Convergence, LeNetOnFashionMnistWithTwoWorkersDistAsync) {
  TempDir dir;
  const std::string out =
      RunJob(2,
             {BinaryPath("src/train/dtrain-train"), "--dataset", "fashion-mnist", "--network",
              "lenet", "--kvstore", "dist_async", "--epochs", "1", "--log-interval", "0"},
             dir.path() + "/log");
  EXPECT_GE(LastTestAccuracy(out), 0.8) << out;
}

// Save after one epoch, resume for another: the optimizer's state travels with the model, from the
// servers (update_on_kvstore) or from the worker.
TEST(SaveResume, OptimizerStateComesBackOnEverySide) {
  for (const std::string update_on_kvstore : {"true", "false"}) {
    TempDir dir;
    const std::string model = dir.path() + "/model.pt";
    auto job = [&](std::vector<std::string> extra, int servers) {
      std::vector<std::string> argv = {BinaryPath("src/tools/dtrain"),
                                       "launch",
                                       "-n",
                                       "2",
                                       "-s",
                                       std::to_string(servers),
                                       "--launcher",
                                       "local",
                                       "--",
                                       BinaryPath("src/train/dtrain-train"),
                                       "--kvstore",
                                       "dist_sync",
                                       "--epochs",
                                       "1",
                                       "--limit-train",
                                       "2048",
                                       "--log-interval",
                                       "0",
                                       "--update-on-kvstore",
                                       update_on_kvstore};
      argv.insert(argv.end(), extra.begin(), extra.end());
      Subprocess p(argv, {}, dir.path() + "/log" + std::to_string(servers));
      auto code = p.Wait(kHangGuardMs);
      EXPECT_TRUE(code.has_value()) << p.Output();
      return std::make_pair(code.value_or(-1), p.Output());
    };
    auto [saved, out1] = job({"--save", model}, 2);
    ASSERT_EQ(saved, 0) << out1;
    auto [resumed, out2] = job({"--resume", model}, 2);
    EXPECT_EQ(resumed, 0) << out2;
    EXPECT_GT(LastTestAccuracy(out2), 0.5) << out2;
    if (update_on_kvstore == "true") {
      // The servers' states only fit a job with as many servers.
      auto [refused, out3] = job({"--resume", model}, 1);
      EXPECT_NE(refused, 0) << out3;
      EXPECT_NE(out3.find("different number of servers"), std::string::npos) << out3;
    }
  }
}

struct BadInput {
  std::vector<std::string> args;
  std::string expected;
};

class TrainBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(TrainBadInput, IsAClearError) {
  TempDir dir;
  std::vector<std::string> argv = {BinaryPath("src/train/dtrain-train"), "--epochs", "1"};
  for (auto a : GetParam().args) {
    if (a == "<dir>") a = dir.path();
    argv.push_back(a);
  }
  // A corrupt idx file for the case that asks for one.
  std::ofstream(dir.path() + "/train-images-idx3-ubyte") << "not an idx file";
  Subprocess p(argv, {}, dir.path() + "/log");
  auto code = p.Wait(kHangGuardMs);
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_NE(p.Output().find(GetParam().expected), std::string::npos) << p.Output();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TrainBadInput,
    ::testing::Values(BadInput{{"--network", "nosuchnet"}, "nosuchnet"},
                      BadInput{{"--optimizer", "nosuchopt"}, "nosuchopt"},
                      BadInput{{"--dataset", "imagenet"}, "imagenet"},
                      BadInput{{"--data-dir", "/nonexistent/dir"}, "/nonexistent/dir"},
                      BadInput{{"--dataset", "mnist", "--data-dir", "<dir>"}, "train-images"},
                      BadInput{{"--batch-size", "0"}, "batch-size"}));

}  // namespace
}  // namespace dtrain::testing

// Allreduce mode end to end, as real processes: `--kvstore horovod` under `dtrain launch -s 0`
// (Gloo) and under a real `mpirun` (OpenMPI), against one worker given the whole batch; LeNet on
// the real Fashion-MNIST; a rank that dies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "subprocess.h"
#include "train_results.h"

namespace dtrain::testing {
namespace {

constexpr int kHangGuardMs = 600000;

enum class Via { kSingle, kLaunchGloo, kMpirun, kLaunchMpi };

// Subprocess execs without a PATH search.
std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return name;
}

std::vector<std::string> MpirunPrefix(int np) {
  std::vector<std::string> argv = {FindInPath("mpirun"), "-np",       std::to_string(np),
                                   "--oversubscribe",    "--bind-to", "none"};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
  return argv;
}

std::string RunJob(Via via, int workers, std::vector<std::string> argv, const std::string& log) {
  std::vector<std::string> prefix;
  if (via == Via::kLaunchGloo) {
    prefix = {
        BinaryPath("src/tools/dtrain"), "launch", "-n", std::to_string(workers), "-s", "0", "--"};
  } else if (via == Via::kMpirun) {
    prefix = MpirunPrefix(workers);
  } else if (via == Via::kLaunchMpi) {
    prefix = {BinaryPath("src/tools/dtrain"),
              "launch",
              "-n",
              std::to_string(workers),
              "-s",
              "0",
              "--launcher",
              "mpi",
              "--"};
  }
  argv.insert(argv.begin(), prefix.begin(), prefix.end());
  // Containers often lack the kernel support for OpenMPI's single-copy shared memory.
  Subprocess p(argv, {{"OMPI_MCA_btl_vader_single_copy_mechanism", "none"}}, log);
  auto code = p.Wait(kHangGuardMs);
  EXPECT_TRUE(code.has_value()) << "hung: " << p.Output();
  EXPECT_EQ(code.value_or(-1), 0) << p.Output();
  return p.Output();
}

class HorovodExactness : public ::testing::Test {
 protected:
  std::string Run(Via via, int workers, std::vector<std::string> extra) {
    const std::string out = dir.path() + "/params" + std::to_string(runs++) + ".bin";
    RunJob(via, workers, ExactnessArgs(out, std::move(extra)), out + ".log");
    return out;
  }
  void ExpectSame(const std::string& a, const std::string& b) { ExpectSameParameters(a, b); }
  TempDir dir;
  int runs = 0;
};

TEST_F(HorovodExactness, TwoWorkersOverGlooMatchOneWorkerWithTheWholeBatch) {
  const std::string one = Run(Via::kSingle, 0, {"--kvstore", "local"});
  ExpectSame(one, Run(Via::kLaunchGloo, 2, {"--kvstore", "horovod"}));
  ExpectSame(one,
             Run(Via::kLaunchGloo, 2,
                 {"--kvstore", "horovod", "--update-on-kvstore", "false", "--fuse-below-kb", "0"}));
}

TEST_F(HorovodExactness, TwoWorkersOverMpiMatchOneWorkerWithTheWholeBatch) {
  const std::string one = Run(Via::kSingle, 0, {"--kvstore", "local"});
  ExpectSame(one, Run(Via::kMpirun, 2, {"--kvstore", "horovod"}));
  ExpectSame(one, Run(Via::kMpirun, 2, {"--kvstore", "horovod", "--update-on-kvstore", "false"}));
}

TEST(HorovodConvergence, LeNetOnFashionMnistWithTwoWorkers) {
  TempDir dir;
  const std::string out =
      RunJob(Via::kLaunchGloo, 2,
             {BinaryPath("src/train/dtrain-train"), "--dataset", "fashion-mnist", "--network",
              "lenet", "--kvstore", "horovod", "--epochs", "2", "--log-interval", "0"},
             dir.path() + "/log");
  EXPECT_GE(LastTestAccuracy(out), 0.86) << out;  // the dist_sync floor (train_job_test.cc)
}

// The LibTorch API (BroadcastParameters, DistributedOptimizer) in a Horovod-style loop: two ranks
// with half of every global batch follow one process given all of it.
TEST(HorovodTorchApi, TwoRanksMatchOneProcessGivenTheWholeBatch) {
  TempDir dir;
  auto run = [&](Via via, int workers, const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> argv = {BinaryPath("examples/dtrain-horovod-example"),
                                     "--network",
                                     "mlp",
                                     "--steps",
                                     "30",
                                     "--global-batch",
                                     "32",
                                     "--out",
                                     out};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunJob(via, workers, argv, out + ".log");
  };
  run(Via::kSingle, 0, dir.path() + "/one.bin", {});
  run(Via::kLaunchGloo, 2, dir.path() + "/gloo.bin", {});
  run(Via::kMpirun, 2, dir.path() + "/mpi.bin", {});
  ExpectSameParameters(dir.path() + "/one.bin", dir.path() + "/gloo.bin");
  ExpectSameParameters(dir.path() + "/one.bin", dir.path() + "/mpi.bin");
  // float16 on the wire: close to, not equal to, the exact path.
  const std::string out = run(Via::kLaunchGloo, 2, dir.path() + "/fp16.bin", {"--fp16"});
  const double diff = MaxRelativeDifference(ReadFloats(dir.path() + "/one.bin"),
                                            ReadFloats(dir.path() + "/fp16.bin"));
  EXPECT_GT(diff, 0.0) << "fp16 compression changed nothing: was it applied?";
  EXPECT_LT(diff, 0.05) << out;
}

// Two ranks started by hand (no launcher to stop the survivor): killing one must make the other
// fail with an error that names the lost rank, not wait forever.
TEST(HorovodFailure, ARankThatDiesStopsTheOther) {
  TempDir dir;
  const std::string port = std::to_string(FreePort());
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{BinaryPath("src/train/dtrain-train"), "--dataset", "synthetic",
                                 "--network", "mlp", "--kvstore", "horovod", "--epochs", "1000",
                                 "--log-interval", "0"},
        std::map<std::string, std::string>{{"DMLC_ROLE", "worker"},
                                           {"DMLC_NUM_WORKER", "2"},
                                           {"DMLC_NUM_SERVER", "0"},
                                           {"DTRAIN_NODE_RANK", std::to_string(r)},
                                           {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                                           {"DMLC_PS_ROOT_PORT", port},
                                           {"DTRAIN_COLLECTIVES", "gloo"}},
        dir.path() + "/rank" + std::to_string(r) + ".log"));
  }
  // Let training get going, then kill rank 1.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_TRUE(ranks[0]->Running()) << ranks[0]->Output();
  ranks[1]->Kill(SIGKILL);
  auto code = ranks[0]->Wait(60000);
  ASSERT_TRUE(code.has_value()) << "rank 0 hung after rank 1 died: " << ranks[0]->Output();
  EXPECT_NE(*code, 0);
  EXPECT_NE(ranks[0]->Output().find("rank 1"), std::string::npos) << ranks[0]->Output();
}

}  // namespace
}  // namespace dtrain::testing

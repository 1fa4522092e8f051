#include "collectives/config.h"

#include <gtest/gtest.h>

#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

CollectivesConfig Read(std::map<std::string, std::string> vars) {
  return CollectivesConfig::FromEnvironment(MapEnvironment(std::move(vars)));
}

// The message of the ConfigError that `vars` cause, or "" when they are accepted.
std::string ErrorOf(std::map<std::string, std::string> vars) {
  try {
    Read(std::move(vars));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

const std::map<std::string, std::string> kGlooJob = {{"DTRAIN_NODE_RANK", "1"},
                                                     {"DMLC_NUM_WORKER", "3"},
                                                     {"DMLC_PS_ROOT_URI", "10.0.0.1"},
                                                     {"DMLC_PS_ROOT_PORT", "9000"}};

std::map<std::string, std::string> GlooJobWith(std::map<std::string, std::string> extra) {
  auto vars = kGlooJob;
  for (auto& [k, v] : extra) vars[k] = v;
  return vars;
}

TEST(CollectivesConfig, DefaultsOutsideAnyLauncherAreAGlooJobOfOne) {
  auto c = Read({});
  EXPECT_EQ(c.backend, BackendKind::kGloo);
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.size, 1);
  EXPECT_EQ(c.fusion_threshold_bytes, size_t{64} << 20);
  EXPECT_EQ(c.cycle_time, std::chrono::microseconds(1000));
  EXPECT_EQ(c.stall_warning, Duration(60000));
  EXPECT_EQ(c.collective_timeout, Duration(600000));
  EXPECT_EQ(c.spin_wait, std::chrono::microseconds(1000));
  EXPECT_FALSE(c.fp16_allreduce);
}

TEST(CollectivesConfig, MpirunSelectsMpiUnlessToldOtherwise) {
  EXPECT_EQ(Read({{"OMPI_COMM_WORLD_SIZE", "2"}}).backend, BackendKind::kMpi);
  EXPECT_EQ(Read({{"OMPI_COMM_WORLD_SIZE", "2"}, {"DTRAIN_COLLECTIVES", "gloo"}}).backend,
            BackendKind::kGloo);
  EXPECT_EQ(Read({{"DTRAIN_COLLECTIVES", "mpi"}}).backend, BackendKind::kMpi);
}

TEST(CollectivesConfig, GlooLayoutFromTheLauncherVariables) {
  auto c = Read(kGlooJob);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.size, 3);
  EXPECT_EQ(c.rendezvous_host, "10.0.0.1");
  EXPECT_EQ(c.rendezvous_port, 9000);
  auto f = Read({{"DTRAIN_NODE_RANK", "0"},
                 {"DMLC_NUM_WORKER", "2"},
                 {"DTRAIN_GLOO_FILE_STORE", "/tmp/x"},
                 {"DMLC_INTERFACE", "eth0"}});
  EXPECT_EQ(f.file_store_dir, "/tmp/x");
  EXPECT_EQ(f.interface, "eth0");
}

TEST(CollectivesConfig, TuningVariablesAndTheirHorovodNames) {
  auto c = Read(GlooJobWith({{"DTRAIN_FUSION_THRESHOLD_MB", "16"},
                             {"DTRAIN_CYCLE_TIME_MS", "2.5"},
                             {"DTRAIN_STALL_WARNING_S", "5"},
                             {"DTRAIN_COLLECTIVE_TIMEOUT_MS", "1500"},
                             {"DTRAIN_SPIN_WAIT_US", "0"},
                             {"DTRAIN_FP16_ALLREDUCE", "1"}}));
  EXPECT_EQ(c.fusion_threshold_bytes, size_t{16} << 20);
  EXPECT_EQ(c.cycle_time, std::chrono::microseconds(2500));
  EXPECT_EQ(c.stall_warning, Duration(5000));
  EXPECT_EQ(c.collective_timeout, Duration(1500));
  EXPECT_EQ(c.spin_wait, std::chrono::microseconds(0));
  EXPECT_TRUE(c.fp16_allreduce);

  auto h = Read(GlooJobWith({{"HOROVOD_FUSION_THRESHOLD", "1048576"},
                             {"HOROVOD_CYCLE_TIME", "0.5"},
                             {"HOROVOD_STALL_CHECK_TIME_SECONDS", "7"}}));
  EXPECT_EQ(h.fusion_threshold_bytes, size_t{1} << 20);
  EXPECT_EQ(h.cycle_time, std::chrono::microseconds(500));
  EXPECT_EQ(h.stall_warning, Duration(7000));

  // Ours wins over Horovod's; 0 disables fusion.
  auto both = Read(
      GlooJobWith({{"DTRAIN_FUSION_THRESHOLD_MB", "0"}, {"HOROVOD_FUSION_THRESHOLD", "1048576"}}));
  EXPECT_EQ(both.fusion_threshold_bytes, 0u);
}

TEST(CollectivesConfig, BadValuesNameTheVariableAndTheValue) {
  struct BadCase {
    std::map<std::string, std::string> vars;
    std::string expected;
  };
  const std::vector<BadCase> cases = {
      {{{"DTRAIN_COLLECTIVES", "nccl"}}, "DTRAIN_COLLECTIVES='nccl'"},
      {GlooJobWith({{"DTRAIN_FUSION_THRESHOLD_MB", "lots"}}), "DTRAIN_FUSION_THRESHOLD_MB='lots'"},
      {GlooJobWith({{"DTRAIN_FUSION_THRESHOLD_MB", "1.5"}}), "DTRAIN_FUSION_THRESHOLD_MB='1.5'"},
      {GlooJobWith({{"HOROVOD_FUSION_THRESHOLD", "-1"}}),
       "HOROVOD_FUSION_THRESHOLD=-1 is out of range"},
      {GlooJobWith({{"DTRAIN_CYCLE_TIME_MS", "1e3"}}), "DTRAIN_CYCLE_TIME_MS='1e3'"},
      {GlooJobWith({{"HOROVOD_CYCLE_TIME", "99999"}}), "HOROVOD_CYCLE_TIME=99999"},
      {GlooJobWith({{"DTRAIN_STALL_WARNING_S", "x"}}), "DTRAIN_STALL_WARNING_S='x'"},
      {GlooJobWith({{"DTRAIN_COLLECTIVE_TIMEOUT_MS", "0"}}), "DTRAIN_COLLECTIVE_TIMEOUT_MS=0"},
      {GlooJobWith({{"DTRAIN_SPIN_WAIT_US", "-1"}}), "DTRAIN_SPIN_WAIT_US=-1 is out of range"},
      {GlooJobWith({{"DTRAIN_FP16_ALLREDUCE", "maybe"}}), "DTRAIN_FP16_ALLREDUCE='maybe'"},
      {GlooJobWith({{"DTRAIN_GLOO_ALGORITHM", "tree"}}), "DTRAIN_GLOO_ALGORITHM='tree'"},
      {GlooJobWith({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "on"}}),
       "HOROVOD_HIERARCHICAL_ALLREDUCE='on'"},
      {GlooJobWith({{"DTRAIN_NODE_RANK", "3"}}), "DTRAIN_NODE_RANK=3"},
      {GlooJobWith({{"DMLC_PS_ROOT_PORT", "70000"}}), "DMLC_PS_ROOT_PORT=70000"},
      {{{"DTRAIN_NODE_RANK", "0"}}, "DMLC_NUM_WORKER is not set"},
      {{{"DTRAIN_NODE_RANK", "0"}, {"DMLC_NUM_WORKER", "2"}}, "DMLC_PS_ROOT_URI is not set"},
      {{{"DTRAIN_NODE_RANK", "0"}, {"DMLC_NUM_WORKER", "2"}, {"DMLC_PS_ROOT_URI", "h"}},
       "DMLC_PS_ROOT_PORT is not set"},
  };
  for (const auto& c : cases) {
    const std::string error = ErrorOf(c.vars);
    EXPECT_NE(error.find(c.expected), std::string::npos)
        << "expected '" << c.expected << "' in '" << error << "'";
  }
}

TEST(CollectivesConfig, HierarchicalAllreduceIsNcclsWhereNcclIsUsed) {
  EXPECT_FALSE(Read(kGlooJob).nccl_hierarchical);
  // Host arrays are hierarchical already (DTRAIN_GLOO_SHM); Horovod's variable is about NCCL.
  EXPECT_EQ(Read(GlooJobWith({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"}})).nccl_hierarchical,
            NcclBuilt());
  EXPECT_FALSE(Read(GlooJobWith({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"},
                                 {"HOROVOD_GPU_OPERATIONS", "GLOO"}}))
                   .nccl_hierarchical);
  EXPECT_FALSE(Read(GlooJobWith({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "0"}})).nccl_hierarchical);
}

TEST(CollectivesConfig, MpiIgnoresTheGlooLayout) {
  // Under mpirun the launcher variables may be absent or stale; MPI knows the layout.
  auto c = Read({{"DTRAIN_COLLECTIVES", "mpi"}, {"DTRAIN_NODE_RANK", "0"}});
  EXPECT_EQ(c.backend, BackendKind::kMpi);
}

TEST(CollectivesConfig, DescribeListsTheValuesInEffect) {
  const std::string d = Read(kGlooJob).Describe();
  EXPECT_NE(d.find("DTRAIN_COLLECTIVES=gloo"), std::string::npos) << d;
  EXPECT_NE(d.find("DMLC_PS_ROOT_PORT=9000"), std::string::npos) << d;
  EXPECT_NE(d.find("DTRAIN_COLLECTIVE_TIMEOUT_MS=600000"), std::string::npos) << d;
}

}  // namespace
}  // namespace dtrain::collectives

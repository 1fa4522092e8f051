// The cores a process may use: a cgroup's CPU quota (a pod's or container's limit) read as
// Kubernetes and Docker write it.
#include "common/usable_cores.h"

#include <gtest/gtest.h>

#include <thread>

namespace dtrain {
namespace {

TEST(UsableCores, CgroupV2CpuMax) {
  EXPECT_EQ(CoresOfCpuMax("max 100000"), std::nullopt);  // no limit
  EXPECT_EQ(CoresOfCpuMax("200000 100000"), 2);          // limits.cpu: 2
  EXPECT_EQ(CoresOfCpuMax("150000 100000"), 2);          // 1.5 cores: 2 threads, rounded up
  EXPECT_EQ(CoresOfCpuMax("50000 100000"), 1);           // 500m: at least one
  EXPECT_EQ(CoresOfCpuMax(""), std::nullopt);
  EXPECT_EQ(CoresOfCpuMax("12x 100000"), std::nullopt);
  EXPECT_EQ(CoresOfCpuMax("100000"), std::nullopt);
}

TEST(UsableCores, CgroupV1Quota) {
  EXPECT_EQ(CoresOfCfsQuota(-1, 100000), std::nullopt);
  EXPECT_EQ(CoresOfCfsQuota(400000, 100000), 4);
  EXPECT_EQ(CoresOfCfsQuota(100000, 0), std::nullopt);
}

TEST(UsableCores, NeverMoreThanTheMachineNorFewerThanOne) {
  EXPECT_GE(UsableCores(), 1);
  EXPECT_LE(UsableCores(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace dtrain

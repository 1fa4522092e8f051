// The worker's heap keeps what a step frees (common/malloc_tuning.h): the decision from the
// environment, and the effect itself, counted in page faults.
#include "common/malloc_tuning.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace dtrain {
namespace {

constexpr size_t kMB = size_t{1} << 20;

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// One "step" as LibTorch's: eight 1 MB tensors written and freed together. glibc's defaults
// return the 8 MB to the kernel at the last free (more than twice the largest block freed), so
// every step faults its 2,048 pages in again.
void Step() {
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(std::malloc(kMB + 4096 * i));
    std::memset(blocks.back(), i + 1, kMB + 4096 * i);
  }
  for (void* b : blocks) std::free(b);
}

TEST(MallocTuning, TheEnvironmentDecides) {
#if defined(__GLIBC__)
  EXPECT_EQ(DecideMallocTuning(256 * kMB, MapEnvironment({})), MallocTuning::kApplied);
  EXPECT_EQ(DecideMallocTuning(0, MapEnvironment({})), MallocTuning::kOff);
  // The user's own glibc settings stand.
  EXPECT_EQ(DecideMallocTuning(
                256 * kMB, MapEnvironment({{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1"}})),
            MallocTuning::kUserSettings);
  EXPECT_EQ(DecideMallocTuning(256 * kMB, MapEnvironment({{"MALLOC_TRIM_THRESHOLD_", "9"}})),
            MallocTuning::kUserSettings);
  EXPECT_EQ(DecideMallocTuning(256 * kMB, MapEnvironment({{"MALLOC_MMAP_THRESHOLD_", "9"}})),
            MallocTuning::kUserSettings);
  // Tunables of other parts of glibc do not count.
  EXPECT_EQ(
      DecideMallocTuning(256 * kMB, MapEnvironment({{"GLIBC_TUNABLES", "glibc.pthread.rseq=0"}})),
      MallocTuning::kApplied);
#else
  GTEST_SKIP() << "not glibc";
#endif
}

TEST(MallocTuning, AMalformedSettingAppliesNothingHere) {
  // Config::FromEnvironment names it when the job starts; the import of dtrain must not throw.
  EXPECT_EQ(KeepFreedMemoryAsConfigured(MapEnvironment({{"DTRAIN_KEEP_FREED_MB", "lots"}})),
            MallocTuning::kOff);
}

TEST(MallocTuning, StepsAfterTheFirstFaultNoPagesIn) {
#if defined(__GLIBC__)
  if (DecideMallocTuning(256 * kMB, ProcessEnvironment()) != MallocTuning::kApplied) {
    GTEST_SKIP() << "this environment sets glibc's malloc variables itself";
  }
  ASSERT_EQ(KeepFreedMemory(256 * kMB), MallocTuning::kApplied);
  Step();
  Step();
  const long before = MinorFaults();
  for (int i = 0; i < 20; ++i) Step();
  // 20 steps of 2,048+ pages each, by default about 41,000 faults; kept, none but strays.
  EXPECT_LT(MinorFaults() - before, 500);
#else
  GTEST_SKIP() << "not glibc";
#endif
}

}  // namespace
}  // namespace dtrain

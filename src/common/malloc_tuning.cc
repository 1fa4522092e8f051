#include "common/malloc_tuning.h"

#include <algorithm>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "common/config/config.h"
#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain {

MallocTuning DecideMallocTuning(size_t keep_bytes, const EnvLookup& env) {
#if !defined(__GLIBC__)
  (void)keep_bytes;
  (void)env;
  return MallocTuning::kNotGlibc;
#else
  if (keep_bytes == 0) return MallocTuning::kOff;
  const auto tunables = env("GLIBC_TUNABLES");
  if ((tunables && tunables->find("glibc.malloc.") != std::string::npos) ||
      env("MALLOC_TRIM_THRESHOLD_") || env("MALLOC_MMAP_THRESHOLD_") || env("MALLOC_TOP_PAD_")) {
    return MallocTuning::kUserSettings;
  }
  return MallocTuning::kApplied;
#endif
}

MallocTuning KeepFreedMemory(size_t keep_bytes, const EnvLookup& env) {
  static std::once_flag once;
  static MallocTuning outcome = MallocTuning::kOff;
  std::call_once(once, [&] {
    outcome = DecideMallocTuning(keep_bytes, env);
#if defined(__GLIBC__)
    if (outcome == MallocTuning::kApplied) {
      // Both at once: setting either turns off glibc's automatic thresholds, and the mapping
      // threshold alone (128 KB fixed) would map every tensor bigger than that afresh.
      const bool ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapBlockLimitBytes)) == 1 &&
                      mallopt(M_TRIM_THRESHOLD,
                              static_cast<int>(std::min<size_t>(keep_bytes, size_t{1} << 30))) == 1;
      if (!ok) outcome = MallocTuning::kNotGlibc;
    }
#endif
    DTRAIN_LOG(kConnections) << "malloc: " << Describe(outcome);
  });
  return outcome;
}

MallocTuning KeepFreedMemoryAsConfigured(const EnvLookup& env) {
  std::optional<size_t> set;
  try {
    set = KeepFreedBytesFromEnvironment(EnvReader(env));
  } catch (const ConfigError&) {
    return MallocTuning::kOff;
  }
  return KeepFreedMemory(set.value_or(Config{}.keep_freed_bytes), env);
}

std::string Describe(MallocTuning tuning) {
  switch (tuning) {
    case MallocTuning::kApplied:
      return "freed memory kept for reuse (DTRAIN_KEEP_FREED_MB)";
    case MallocTuning::kOff:
      return "glibc's defaults (DTRAIN_KEEP_FREED_MB=0)";
    case MallocTuning::kUserSettings:
      return "the environment's glibc malloc settings";
    case MallocTuning::kNotGlibc:
      return "left as it is (not glibc's malloc)";
  }
  return "?";
}

}  // namespace dtrain

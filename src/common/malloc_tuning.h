// Keeps the memory a training process frees in its heap, for the next step, instead of handing it
// back to the kernel and faulting it in again.
//
// Why: LibTorch allocates each step's activations and gradients with malloc and frees them at the
// end of the step. glibc returns the free top of its heap to the kernel once it exceeds twice the
// largest block freed so far, so a step whose many ~1 MB tensors add up to more than that gets
// fresh pages every step: a LeNet worker (batch 64) took 1,150 page faults a step, 20-25% of its
// time, in one process of two at random (heap layout decides). With the heap kept, none.
// PyTorch's own CPU launcher (torch.backends.xeon.run_cpu) preloads jemalloc or tcmalloc for the
// same reason; this does it with glibc's own settings, in every worker, however it was started.
//
// Applied by the worker front ends (import dtrain, dtrain-train), never by the servers, whose
// buffers come from pools. A user's own glibc malloc settings (GLIBC_TUNABLES glibc.malloc.*,
// MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_) win over it.
#pragma once

#include <cstddef>
#include <string>

#include "common/config/env_reader.h"

namespace dtrain {

// Blocks up to this size come from the heap (glibc's largest automatic threshold); bigger ones
// are mapped and unmapped each time, as by default.
inline constexpr size_t kHeapBlockLimitBytes = size_t{32} << 20;

enum class MallocTuning {
  kApplied,       // the heap keeps up to keep_bytes of freed memory
  kOff,           // DTRAIN_KEEP_FREED_MB=0
  kUserSettings,  // the user set glibc's malloc variables: theirs stand
  kNotGlibc,      // another C library (or a preloaded allocator's own rules)
};

// What KeepFreedMemory would do, from the environment alone.
MallocTuning DecideMallocTuning(size_t keep_bytes, const EnvLookup& env);

// Applies keep_bytes (Config::keep_freed_bytes) to this process's malloc unless the environment
// says otherwise, once (later calls return the first outcome). Thread-safe.
MallocTuning KeepFreedMemory(size_t keep_bytes, const EnvLookup& env = ProcessEnvironment());

// KeepFreedMemory with DTRAIN_KEEP_FREED_MB from the environment (Config's default when unset).
// A malformed value applies nothing here: the process's Config reports it when the job starts.
MallocTuning KeepFreedMemoryAsConfigured(const EnvLookup& env = ProcessEnvironment());

std::string Describe(MallocTuning tuning);

}  // namespace dtrain

// The launch shape of dtrain's grid-stride kernels (src/cuda, the optimizers', the codecs'): blocks
// of whole warps, and enough of them to fill any current GPU, never more than the data needs.
#pragma once

#include <cstdint>

namespace dtrain::cuda {

// Threads a block: whole warps, so that a thread's lane is its index mod 32 (the codecs rely on
// it).
constexpr int kBlockThreads = 256;

// Blocks for `n` elements, one a thread: at least 1, at most 4096 (a grid-stride loop does the
// rest).
inline unsigned GridBlocks(int64_t n) {
  const int64_t wanted = (n + kBlockThreads - 1) / kBlockThreads;
  return static_cast<unsigned>(wanted < 4096 ? (wanted > 0 ? wanted : 1) : 4096);
}

}  // namespace dtrain::cuda

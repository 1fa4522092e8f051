// The readers behind LoadDataset, one per on-disk format, and the seed mixing that the random
// parts of this folder share. Internal to src/train/data: callers use dataset.h.
//
// Every reader treats its input files as untrusted: sizes are checked against what the file really
// holds before anything is allocated for them, and every problem is a dtrain::Error whose message
// names the file and what is wrong with it.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/train/data/dataset.h"

namespace dtrain::train::data_internal {

// Per-channel normalisation applied after scaling the pixels to [0, 1]: x' = (x - mean) / std.
struct ChannelStats {
  double mean;
  double std;
};

// What an idx data set (MNIST and its drop-in replacements) is called, how it is normalised, and
// what to tell a user who does not have its files.
struct IdxDatasetInfo {
  std::string name;      // "fashion-mnist", "mnist": prefixes every error message
  ChannelStats stats;    // of the training images
  std::string get_hint;  // how to get the four idx files, appended to "not found" errors
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir`: 28x28 single-channel images
// and labels in [0, 10). A .gz name is preferred; the uncompressed file is used only if it is
// absent.
ImageDataset LoadIdxDataset(const IdxDatasetInfo& info, const std::string& dir, Split split);

// Reads the CIFAR-10 binary version from `dir` or `dir`/cifar-10-batches-bin: data_batch_1..5.bin
// for kTrain, test_batch.bin for kTest; records of 1 label byte and 3x32x32 pixel bytes (CHW).
ImageDataset LoadCifar10(const std::string& dir, Split split);

// The splitmix64 finaliser: a bijection on 64-bit values that spreads every input bit over the
// whole output.
inline uint64_t Finalize64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline constexpr uint64_t kGolden64 = 0x9e3779b97f4a7c15ULL;

// Mixes two 64-bit values into a well-spread seed, so that nearby inputs (consecutive epochs, seeds
// 0 and 1) give unrelated random streams, and (a, b) differs from (b, a).
inline uint64_t MixSeed(uint64_t a, uint64_t b) {
  return Finalize64(Finalize64(a + kGolden64) ^ Finalize64(b + 2 * kGolden64));
}

}  // namespace dtrain::train::data_internal

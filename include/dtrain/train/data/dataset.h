// Image classification data sets, split by worker, batches split over local devices.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::train {

// Images as float32 (N, C, H, W), scaled to [0, 1] and then normalised per channel with the data
// set's usual mean and standard deviation; labels as int64 (N).
//
// The normalisation, x' = (x / 255 - mean) / std, uses the common constants (the statistics of
// each training set):
//   mnist          mean 0.1307, std 0.3081
//   fashion-mnist  mean 0.2860, std 0.3530
//   cifar10        mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616) for R, G, B
// so the training images have mean about 0 and standard deviation about 1.
struct ImageDataset {
  torch::Tensor images;
  torch::Tensor labels;
  int64_t num_classes = 10;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

enum class Split { kTrain, kTest };

// Names: "fashion-mnist", "mnist" (idx files, the .gz files read directly:
// train-images-idx3-ubyte.gz and so on), "cifar10" (the binary version: data_batch_1.bin ..
// data_batch_5.bin, test_batch.bin, possibly inside cifar-10-batches-bin/), "synthetic"
// (CIFAR-shaped random data, deterministic from `seed`, for benchmarks; data_dir is ignored).
// Throws dtrain::InvalidArgument for an unknown name, dtrain::Error for a missing directory or file
// (saying how to get the data, e.g. `apt-get install dataset-fashion-mnist`) and for a corrupt file
// (naming the file and what is wrong).
//
// Images are (N, 1, 28, 28) for the idx data sets and (N, 3, 32, 32) for cifar10 and synthetic.
// Files are untrusted: magic numbers, sizes against the bytes really there, label ranges and the
// gzip stream are all checked, and buffers grow with the bytes read (at most 64 MiB ahead), not
// with a header's claim; an idx file may claim up to 1 GiB. A .gz name wins over the uncompressed
// file of the same stem. Keeps no state: any thread may call it.
ImageDataset LoadDataset(const std::string& name, const std::string& data_dir, Split split,
                         uint64_t seed = 0);

// Where the data set lives when --data-dir is not given: fashion-mnist ->
// /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist), mnist ->
// /usr/share/datasets/mnist (no Debian package: download the four idx .gz files there or pass
// --data-dir), cifar10 -> ./data/cifar-10-batches-bin, synthetic -> "" (it reads no files).
// Throws dtrain::InvalidArgument for an unknown name.
std::string DefaultDataDir(const std::string& name);

// What LoadDataset("synthetic", ...) returns for each split.
inline constexpr int64_t kSyntheticTrainSize = 50000;
inline constexpr int64_t kSyntheticTestSize = 10000;

// The "synthetic" data set with `num_examples` examples: (num_examples, 3, 32, 32) images with mean
// about 0 and standard deviation about 1, labels in [0, 10). The same (split, seed, num_examples)
// gives the same data on every machine and run; the first k examples do not depend on
// num_examples. Both splits of a seed share the per-class patterns that make the labels
// learnable. Throws dtrain::InvalidArgument if num_examples < 1.
ImageDataset SyntheticDataset(Split split, uint64_t seed, int64_t num_examples);

// MXNet's SplitSampler: worker `part_index` of `num_parts` gets the contiguous range
// [part_index * length / num_parts, ...) of length/num_parts items (the remainder is dropped so
// every worker runs the same number of steps), reshuffled every epoch from (seed, epoch).
//
// Precisely: part_length = length / num_parts, start = part_length * part_index, and
// EpochIndices(epoch) is a permutation of [start, start + part_length), shuffled by std::shuffle
// with a std::mt19937_64 seeded from a mix of (seed, epoch): the same on every run (with the same
// standard library), different for different epochs; in order if `shuffle` is false. Throws
// dtrain::InvalidArgument unless num_parts >= 1, 0 <= part_index < num_parts and
// length >= num_parts. Immutable after construction, so any thread may call EpochIndices.
class SplitSampler {
 public:
  SplitSampler(int64_t length, int num_parts, int part_index, uint64_t seed, bool shuffle = true);
  int64_t size() const { return part_length_; }
  std::vector<int64_t> EpochIndices(int epoch) const;

 private:
  int64_t part_length_;
  int64_t start_;
  uint64_t seed_;
  bool shuffle_;
};

// How a batch of `batch_size` is split over local devices: by `work_load` weights (MXNet's
// work_load_list) or evenly if empty. Returns (offset, size) per device; sizes add up to
// batch_size and differ from the weights' shares by less than one. Throws InvalidArgument for
// non-positive weights or more devices than samples.
//
// Weighted: device i's share is batch_size * w_i / sum(w), rounded by largest remainder (floors
// first, then one more to the largest fractional parts, earlier devices first on ties). Even: the
// first batch_size % num_devices devices get one more. Also throws InvalidArgument for
// num_devices < 1, batch_size < 1, weights that are not finite, a weight count other than
// num_devices, and weights so uneven that a device would get no samples (as MXNet does).
std::vector<std::pair<int64_t, int64_t>> SplitBatch(int64_t batch_size, int num_devices,
                                                    const std::vector<double>& work_load = {});

}  // namespace dtrain::train

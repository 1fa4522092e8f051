// Image classification data sets, split by worker, batches split over local devices.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::train {

// Images as float32 (N, C, H, W), scaled to [0, 1] and then normalised per channel with the data
// set's usual mean and standard deviation; labels as int64 (N).
struct ImageDataset {
  torch::Tensor images;
  torch::Tensor labels;
  int64_t num_classes = 10;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

enum class Split { kTrain, kTest };

// Names: "fashion-mnist", "mnist" (idx files, the .gz files read directly: train-images-idx3-ubyte.gz
// and so on), "cifar10" (the binary version: data_batch_1.bin .. data_batch_5.bin, test_batch.bin,
// possibly inside cifar-10-batches-bin/), "synthetic" (CIFAR-shaped random data, deterministic
// from `seed`, for benchmarks; data_dir is ignored). Throws dtrain::InvalidArgument for an unknown
// name, dtrain::Error for a missing directory or file (saying how to get the data, e.g. `apt-get
// install dataset-fashion-mnist`) and for a corrupt file (naming the file and what is wrong).
ImageDataset LoadDataset(const std::string& name, const std::string& data_dir, Split split,
                         uint64_t seed = 0);

// Where the data set lives when --data-dir is not given (e.g. /usr/share/datasets/fashion-mnist).
std::string DefaultDataDir(const std::string& name);

// MXNet's SplitSampler: worker `part_index` of `num_parts` gets the contiguous range
// [part_index * length / num_parts, ...) of length/num_parts items (the remainder is dropped so
// every worker runs the same number of steps), reshuffled every epoch from (seed, epoch).
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
std::vector<std::pair<int64_t, int64_t>> SplitBatch(int64_t batch_size, int num_devices,
                                                    const std::vector<double>& work_load = {});

}  // namespace dtrain::train

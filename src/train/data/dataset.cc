// LoadDataset and DefaultDataDir: data set names to readers, normalisation and install hints.
#include "dtrain/train/data/dataset.h"

#include "dtrain/common/error.h"
#include "train/data/formats.h"

namespace dtrain::train {
namespace {

using data_internal::IdxDatasetInfo;

constexpr const char* kIdxFiles =
    "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
    "t10k-labels-idx1-ubyte.gz";

IdxDatasetInfo FashionMnistInfo() {
  return {"fashion-mnist",
          {0.2860, 0.3530},
          std::string("install it with `apt-get install dataset-fashion-mnist` (into "
                      "/usr/share/datasets/fashion-mnist), or pass --data-dir with ") +
              kIdxFiles};
}

IdxDatasetInfo MnistInfo() {
  return {"mnist",
          {0.1307, 0.3081},
          std::string("Debian has no MNIST package: download ") + kIdxFiles +
              " (http://yann.lecun.com/exdb/mnist/ or a mirror) into a directory and pass it as "
              "--data-dir"};
}

[[noreturn]] void UnknownName(const std::string& name) {
  throw InvalidArgument("unknown data set '" + name +
                        "'; known: fashion-mnist, mnist, cifar10, synthetic");
}

}  // namespace

ImageDataset LoadDataset(const std::string& name, const std::string& data_dir, Split split,
                         uint64_t seed) {
  if (name == "fashion-mnist")
    return data_internal::LoadIdxDataset(FashionMnistInfo(), data_dir, split);
  if (name == "mnist") return data_internal::LoadIdxDataset(MnistInfo(), data_dir, split);
  if (name == "cifar10") return data_internal::LoadCifar10(data_dir, split);
  if (name == "synthetic") {
    return SyntheticDataset(split, seed,
                            split == Split::kTrain ? kSyntheticTrainSize : kSyntheticTestSize);
  }
  UnknownName(name);
}

std::string DefaultDataDir(const std::string& name) {
  if (name == "fashion-mnist") return "/usr/share/datasets/fashion-mnist";
  if (name == "mnist") return "/usr/share/datasets/mnist";
  if (name == "cifar10") return "./data/cifar-10-batches-bin";
  if (name == "synthetic") return "";
  UnknownName(name);
}

}  // namespace dtrain::train

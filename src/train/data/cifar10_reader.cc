// The binary version of CIFAR-10 (https://www.cs.toronto.edu/~kriz/cifar.html): files of records
// of 1 label byte followed by 3072 pixel bytes, 1024 each for red, green and blue, each plane row
// by row (so a record is already in C, H, W order).
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "train/data/formats.h"

namespace dtrain::train::data_internal {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kChannels = 3;
constexpr int64_t kSide = 32;
constexpr int64_t kPixels = kChannels * kSide * kSide;
constexpr int64_t kRecordBytes = 1 + kPixels;
constexpr int64_t kNumClasses = 10;
constexpr int kTrainFiles = 5;
// Per-channel mean and standard deviation of the training images scaled to [0, 1].
constexpr double kMean[kChannels] = {0.4914, 0.4822, 0.4465};
constexpr double kStd[kChannels] = {0.2470, 0.2435, 0.2616};

constexpr const char* kGetHint =
    "download https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz and unpack it in ./data "
    "(giving ./data/cifar-10-batches-bin), or pass --data-dir with data_batch_1.bin .. "
    "data_batch_5.bin and test_batch.bin";

[[noreturn]] void Fail(const std::string& path, const std::string& problem) {
  throw Error("cifar10: " + path + ": " + problem);
}

// Appends the records of `path` to `bytes`; returns how many there were.
int64_t AppendRecords(const std::string& path, std::vector<uint8_t>& bytes) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) Fail(path, "cannot read its size: " + ec.message());
  if (size == 0) Fail(path, "empty file");
  if (size % kRecordBytes != 0) {
    Fail(path, std::to_string(size) + " bytes is not a whole number of " +
                   std::to_string(kRecordBytes) + "-byte records (1 label + 3x32x32 pixels); " +
                   "truncated or not a CIFAR-10 binary file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(path, std::string("cannot open: ") + std::strerror(errno));
  const size_t old_size = bytes.size();
  bytes.resize(old_size + size);
  in.read(reinterpret_cast<char*>(bytes.data() + old_size), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) {
    Fail(path, "read only " + std::to_string(in.gcount()) + " of " + std::to_string(size) +
                   " bytes (file changed while reading?)");
  }
  const int64_t records = static_cast<int64_t>(size) / kRecordBytes;
  for (int64_t r = 0; r < records; ++r) {
    const uint8_t label = bytes[old_size + r * kRecordBytes];
    if (label >= kNumClasses) {
      Fail(path, "label " + std::to_string(label) + " of record " + std::to_string(r) +
                     " is out of range [0, " + std::to_string(kNumClasses) + ")");
    }
  }
  return records;
}

// `dir` itself if it holds the batch files, else its cifar-10-batches-bin/ subfolder.
std::string BatchDir(const std::string& dir, const std::string& first_file) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw Error("cifar10: data directory '" + dir + "' does not exist; " + kGetHint);
  }
  if (fs::exists(fs::path(dir) / first_file, ec)) return dir;
  const fs::path nested = fs::path(dir) / "cifar-10-batches-bin";
  if (fs::exists(nested / first_file, ec)) return nested.string();
  throw Error("cifar10: " + (fs::path(dir) / first_file).string() + " not found (nor in " +
              nested.string() + "); " + kGetHint);
}

}  // namespace

ImageDataset LoadCifar10(const std::string& dir, Split split) {
  std::vector<std::string> names;
  if (split == Split::kTrain) {
    for (int i = 1; i <= kTrainFiles; ++i) {
      names.push_back("data_batch_" + std::to_string(i) + ".bin");
    }
  } else {
    names.push_back("test_batch.bin");
  }
  const fs::path batch_dir = BatchDir(dir, names[0]);
  std::vector<uint8_t> bytes;
  int64_t n = 0;
  for (const std::string& name : names) {
    const fs::path path = batch_dir / name;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      throw Error("cifar10: " + path.string() + " not found; " + kGetHint);
    }
    n += AppendRecords(path.string(), bytes);
  }

  const auto records = torch::from_blob(bytes.data(), {n, kRecordBytes},
                                        torch::TensorOptions().dtype(torch::kUInt8));
  ImageDataset out;
  out.images =
      records.narrow(1, 1, kPixels).to(torch::kFloat32).reshape({n, kChannels, kSide, kSide});
  // (x / 255 - mean) / std = x * (1 / (255 std)) - mean / std, per channel.
  double scale[kChannels], shift[kChannels];
  for (int c = 0; c < kChannels; ++c) {
    scale[c] = 1.0 / (255.0 * kStd[c]);
    shift[c] = kMean[c] / kStd[c];
  }
  const auto per_channel = [](const double* v) {
    return torch::tensor({v[0], v[1], v[2]}, torch::kFloat32).view({1, kChannels, 1, 1});
  };
  out.images.mul_(per_channel(scale)).sub_(per_channel(shift));
  out.labels = records.select(1, 0).to(torch::kInt64);
  out.num_classes = kNumClasses;
  return out;
}

}  // namespace dtrain::train::data_internal

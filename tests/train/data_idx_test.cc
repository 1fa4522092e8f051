// The idx data sets: the real Fashion-MNIST from /usr/share/datasets, and small idx files written
// to a temporary directory, valid and corrupt in every way the reader checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>

#include "data_test_support.h"
#include "dtrain/train/data/dataset.h"

namespace dtrain::train {
namespace {

using testing::Bytes;
using testing::ExpectErrorMentioning;
using testing::Idx;
using testing::TempDir;
using testing::WriteFile;
using testing::WriteGzip;

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

// ---- The real Fashion-MNIST ----

class FashionMnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = DefaultDataDir("fashion-mnist");
    if (!std::filesystem::exists(dir_ + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << dir_ << " not installed (apt-get install dataset-fashion-mnist)";
    }
  }

  // Shapes, label counts per class, and normalisation of a whole split.
  static void ExpectWellFormed(const ImageDataset& data, int64_t n, const std::vector<int>& first) {
    ASSERT_EQ(data.size(), n);
    EXPECT_EQ(data.num_classes, 10);
    EXPECT_EQ(data.images.sizes(), (std::vector<int64_t>{n, 1, 28, 28}));
    EXPECT_EQ(data.images.scalar_type(), torch::kFloat32);
    EXPECT_EQ(data.labels.sizes(), (std::vector<int64_t>{n}));
    EXPECT_EQ(data.labels.scalar_type(), torch::kInt64);
    EXPECT_EQ(data.labels.min().item<int64_t>(), 0);
    EXPECT_EQ(data.labels.max().item<int64_t>(), 9);
    const auto counts = torch::bincount(data.labels);
    for (int64_t c = 0; c < 10; ++c) EXPECT_EQ(counts[c].item<int64_t>(), n / 10) << "class " << c;
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(data.labels[i].item<int64_t>(), first[i]);
    // The constants are the training set's statistics; the test set's are within 0.3%.
    EXPECT_NEAR(data.images.mean().item<double>(), 0.0, 0.01);
    EXPECT_NEAR(data.images.std().item<double>(), 1.0, 0.01);
    EXPECT_NEAR(data.images.min().item<double>(), -kFashionMean / kFashionStd, 1e-5);
    EXPECT_NEAR(data.images.max().item<double>(), (1 - kFashionMean) / kFashionStd, 1e-5);
  }

  std::string dir_;
};

TEST_F(FashionMnistTest, TrainSplitHas60000BalancedNormalisedImages) {
  const auto start = std::chrono::steady_clock::now();
  const ImageDataset train = LoadDataset("fashion-mnist", dir_, Split::kTrain);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "loaded 60000 Fashion-MNIST training images in " << seconds << " s\n";
  // Typically ~0.2 s; the bound is loose for busy shared machines and sanitizer builds.
  EXPECT_LT(seconds, 2.0);
  ExpectWellFormed(train, 60000, {9, 0, 0, 3, 0});
}

TEST_F(FashionMnistTest, TestSplitHas10000BalancedImages) {
  ExpectWellFormed(LoadDataset("fashion-mnist", dir_, Split::kTest), 10000, {9, 2, 1, 1, 6});
}

TEST(FashionMnistErrorTest, MissingDirectorySaysHowToInstall) {
  TempDir tmp;
  const std::string missing = tmp / "no-such-dir";
  ExpectErrorMentioning([&] { LoadDataset("fashion-mnist", missing, Split::kTrain); },
                        {missing, "apt-get install dataset-fashion-mnist"});
}

TEST(FashionMnistErrorTest, MissingFileIsNamedWithTheInstallHint) {
  TempDir tmp;
  ExpectErrorMentioning(
      [&] { LoadDataset("fashion-mnist", tmp.str(), Split::kTest); },
      {tmp / "t10k-images-idx3-ubyte.gz", "not found", "apt-get install dataset-fashion-mnist"});
}

TEST(MnistErrorTest, MissingDirectorySaysToDownloadIntoDataDir) {
  TempDir tmp;
  ExpectErrorMentioning([&] { LoadDataset("mnist", tmp / "none", Split::kTrain); },
                        {"mnist", "download", "train-images-idx3-ubyte.gz",
                         "t10k-labels-idx1-ubyte.gz", "--data-dir"});
}

TEST(DatasetNamesTest, DefaultDirectories) {
  EXPECT_EQ(DefaultDataDir("fashion-mnist"), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(DefaultDataDir("mnist"), "/usr/share/datasets/mnist");
  EXPECT_EQ(DefaultDataDir("cifar10"), "./data/cifar-10-batches-bin");
  EXPECT_EQ(DefaultDataDir("synthetic"), "");
  ExpectErrorMentioning<InvalidArgument>([] { DefaultDataDir("imagenet"); }, {"imagenet"});
}

TEST(DatasetNamesTest, UnknownNameIsInvalidArgument) {
  ExpectErrorMentioning<InvalidArgument>([] { LoadDataset("Fashion_MNIST", "", Split::kTrain); },
                                         {"Fashion_MNIST", "fashion-mnist"});
}

// ---- Small idx files ----

// A valid data set of kN 28x28 images (image i has every pixel = (i * 37 + pixel) % 256) and
// labels i % 10, written as .gz files; tests then spoil one of them.
class IdxFilesTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kN = 12;
  static constexpr uint32_t kPixels = 28 * 28;

  static Bytes Pixels(uint32_t n) {
    Bytes out(size_t{n} * kPixels);
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<uint8_t>((k / kPixels) * 37 + k);
    return out;
  }
  static Bytes Labels(uint32_t n) {
    Bytes out(n);
    for (uint32_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i % 10);
    return out;
  }

  void SetUp() override {
    WriteGzip(images_path(), Idx(kImagesMagic, {kN, 28, 28}, Pixels(kN)));
    WriteGzip(labels_path(), Idx(kLabelsMagic, {kN}, Labels(kN)));
  }

  std::string images_path() const { return dir_ / "train-images-idx3-ubyte.gz"; }
  std::string labels_path() const { return dir_ / "train-labels-idx1-ubyte.gz"; }

  ImageDataset Load() const { return LoadDataset("mnist", dir_.str(), Split::kTrain); }

  // Expects loading to fail with a dtrain::Error naming `path` and every one of `needles`.
  void ExpectLoadError(const std::string& path, std::vector<std::string> needles) const {
    needles.insert(needles.begin(), path);
    ExpectErrorMentioning([&] { Load(); }, needles);
  }

  TempDir dir_;
};

TEST_F(IdxFilesTest, ValidFilesLoadWithMnistNormalisation) {
  const ImageDataset data = Load();
  ASSERT_EQ(data.size(), kN);
  EXPECT_EQ(data.images.sizes(), (std::vector<int64_t>{kN, 1, 28, 28}));
  const Bytes pixels = Pixels(kN);
  const auto flat = data.images.reshape({-1});
  for (size_t k :
       {size_t{0}, size_t{1}, size_t{783}, size_t{784}, size_t{5000}, pixels.size() - 1}) {
    EXPECT_NEAR(flat[static_cast<int64_t>(k)].item<double>(), (pixels[k] / 255.0 - 0.1307) / 0.3081,
                1e-5)
        << "pixel " << k;
  }
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(data.labels[i].item<int64_t>(), i % 10);
}

TEST_F(IdxFilesTest, FashionMnistUsesItsOwnConstants) {
  const ImageDataset data = LoadDataset("fashion-mnist", dir_.str(), Split::kTrain);
  EXPECT_NEAR(data.images.reshape({-1})[1].item<double>(), (1 / 255.0 - kFashionMean) / kFashionStd,
              1e-5);
}

TEST_F(IdxFilesTest, UncompressedFilesAreReadWhenNoGzIsThere) {
  std::filesystem::remove(images_path());
  std::filesystem::remove(labels_path());
  WriteFile(dir_ / "t10k-images-idx3-ubyte", Idx(kImagesMagic, {3, 28, 28}, Pixels(3)));
  WriteFile(dir_ / "t10k-labels-idx1-ubyte", Idx(kLabelsMagic, {3}, Labels(3)));
  const ImageDataset data = LoadDataset("mnist", dir_.str(), Split::kTest);
  ASSERT_EQ(data.size(), 3);
  EXPECT_EQ(data.labels[2].item<int64_t>(), 2);
  EXPECT_NEAR(data.images[2][0][0][0].item<double>(),
              (Pixels(3)[2 * kPixels] / 255.0 - 0.1307) / 0.3081, 1e-5);
}

TEST_F(IdxFilesTest, WrongMagicInImages) {
  WriteGzip(images_path(), Idx(0x00000801, {kN, 28, 28}, Pixels(kN)));
  ExpectLoadError(images_path(), {"bad magic number 0x00000801", "expected 0x00000803"});
}

TEST_F(IdxFilesTest, WrongMagicInLabels) {
  WriteGzip(labels_path(), Idx(0x00000c01, {kN}, Labels(kN)));  // int32 labels
  ExpectLoadError(labels_path(), {"bad magic number 0x00000c01", "expected 0x00000801"});
}

TEST_F(IdxFilesTest, TextFileIsNotAnIdxFile) {
  const std::string text = "<html>404 Not Found</html>";
  WriteGzip(images_path(), Bytes(text.begin(), text.end()));
  ExpectLoadError(images_path(), {"bad magic number"});
}

TEST_F(IdxFilesTest, TruncatedImageData) {
  Bytes pixels = Pixels(kN);
  pixels.pop_back();
  WriteGzip(images_path(), Idx(kImagesMagic, {kN, 28, 28}, pixels));
  ExpectLoadError(images_path(), {"truncated", "12x28x28", "9408"});
}

TEST_F(IdxFilesTest, TruncatedHeader) {
  WriteGzip(labels_path(), Idx(kLabelsMagic, {}, {0x00, 0x00}));
  ExpectLoadError(labels_path(), {"truncated", "header"});
}

TEST_F(IdxFilesTest, EmptyFile) {
  WriteFile(images_path(), {});
  ExpectLoadError(images_path(), {"truncated"});
}

TEST_F(IdxFilesTest, OversizedImageFile) {
  Bytes pixels = Pixels(kN + 1);
  WriteGzip(images_path(), Idx(kImagesMagic, {kN, 28, 28}, pixels));
  ExpectLoadError(images_path(), {"oversized"});
}

TEST_F(IdxFilesTest, LabelCountDiffersFromImageCount) {
  WriteGzip(labels_path(), Idx(kLabelsMagic, {kN - 1}, Labels(kN - 1)));
  ExpectLoadError(labels_path(), {"11 labels", "12 images", images_path()});
}

TEST_F(IdxFilesTest, LabelOutOfRange) {
  Bytes labels = Labels(kN);
  labels[7] = 10;
  WriteGzip(labels_path(), Idx(kLabelsMagic, {kN}, labels));
  ExpectLoadError(labels_path(), {"label 10 at index 7", "out of range [0, 10)"});
}

TEST_F(IdxFilesTest, ImagesOfTheWrongSize) {
  WriteGzip(images_path(), Idx(kImagesMagic, {2, 32, 32}, Bytes(2 * 32 * 32)));
  ExpectLoadError(images_path(), {"32x32", "expected 28x28"});
}

TEST_F(IdxFilesTest, NoItems) {
  WriteGzip(labels_path(), Idx(kLabelsMagic, {0}, {}));
  ExpectLoadError(labels_path(), {"no items"});
}

TEST_F(IdxFilesTest, HugeDimensionClaimsFailBeforeAllocating) {
  WriteGzip(images_path(), Idx(kImagesMagic, {0xffffffff, 28, 28}, Pixels(1)));
  ExpectLoadError(images_path(), {"limit", "corrupt header"});
  WriteGzip(images_path(), Idx(kImagesMagic, {2, 0xffffffff, 0xffffffff}, Pixels(1)));
  ExpectLoadError(images_path(), {"limit"});
  SetUp();
  WriteGzip(labels_path(), Idx(kLabelsMagic, {0x80000000}, Labels(kN)));
  ExpectLoadError(labels_path(), {"limit"});
  // Under the limit (1,000,000 images, 784 MB) but far more than the file holds.
  SetUp();
  WriteGzip(images_path(), Idx(kImagesMagic, {1000000, 28, 28}, Pixels(kN)));
  ExpectLoadError(images_path(), {"truncated", "1000000x28x28"});
}

TEST_F(IdxFilesTest, GzNameWithoutGzipData) {
  WriteFile(images_path(), Idx(kImagesMagic, {kN, 28, 28}, Pixels(kN)));
  ExpectLoadError(images_path(), {"not a gzip file"});
}

TEST_F(IdxFilesTest, GzipWithBadChecksum) {
  Bytes gz = testing::ReadFile(images_path());
  gz[gz.size() - 8] ^= 0xff;  // the trailer: CRC-32, then the length
  WriteFile(images_path(), gz);
  ExpectLoadError(images_path(), {"corrupt gzip data"});
}

TEST_F(IdxFilesTest, GzipWithGarbageInTheCompressedStream) {
  Bytes gz = testing::ReadFile(images_path());
  for (size_t k = 20; k < gz.size() - 8; k += 7) gz[k] ^= 0x5a;
  WriteFile(images_path(), gz);
  // Which check catches it depends on what the damaged stream inflates to; any of them names the
  // file.
  ExpectErrorMentioning([&] { Load(); }, {images_path()});
}

TEST_F(IdxFilesTest, TruncatedGzip) {
  Bytes gz = testing::ReadFile(images_path());
  gz.resize(gz.size() / 2);
  WriteFile(images_path(), gz);
  ExpectLoadError(images_path(), {"truncated gzip data"});
}

TEST_F(IdxFilesTest, DirectoryInPlaceOfTheFile) {
  std::filesystem::remove(images_path());
  std::filesystem::create_directory(images_path());  // neither .gz nor raw is a regular file
  ExpectLoadError(images_path(), {"not found"});
}

// Random damage anywhere in either file, compressed or not: loading succeeds (if the damage hit
// only pixels) or throws dtrain::Error naming one of the files; it never crashes.
TEST_F(IdxFilesTest, RandomDamageIsAlwaysACleanError) {
  std::mt19937 rng(12345);
  const Bytes raw_images = Idx(kImagesMagic, {kN, 28, 28}, Pixels(kN));
  const Bytes raw_labels = Idx(kLabelsMagic, {kN}, Labels(kN));
  WriteGzip(dir_ / "gz_images", raw_images);
  WriteGzip(dir_ / "gz_labels", raw_labels);
  const Bytes gz_images = testing::ReadFile(dir_ / "gz_images");
  const Bytes gz_labels = testing::ReadFile(dir_ / "gz_labels");
  int errors = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const bool compressed = trial % 2 == 0;
    const bool damage_images = trial % 4 < 2;
    Bytes images = compressed ? gz_images : raw_images;
    Bytes labels = compressed ? gz_labels : raw_labels;
    Bytes& target = damage_images ? images : labels;
    // Mostly in the first bytes, where the headers are.
    const size_t span = rng() % 2 == 0 ? std::min<size_t>(target.size(), 24) : target.size();
    for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0; --flips) {
      target[rng() % span] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    if (rng() % 4 == 0) target.resize(rng() % target.size());  // and sometimes cut short
    const std::string suffix = compressed ? ".gz" : "";
    std::filesystem::remove(images_path());
    std::filesystem::remove(labels_path());
    for (const char* stem : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}) {
      std::filesystem::remove(dir_ / stem);
    }
    WriteFile(dir_ / ("train-images-idx3-ubyte" + suffix), images);
    WriteFile(dir_ / ("train-labels-idx1-ubyte" + suffix), labels);
    try {
      const ImageDataset data = Load();
      EXPECT_EQ(data.size(), kN) << "trial " << trial;
    } catch (const Error& e) {
      ++errors;
      const std::string message = e.what();
      EXPECT_NE(message.find("train-" + std::string(damage_images ? "images" : "labels")),
                std::string::npos)
          << "trial " << trial << ": " << message;
    }
  }
  EXPECT_GT(errors, 100);
}

}  // namespace
}  // namespace dtrain::train

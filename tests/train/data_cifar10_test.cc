// The CIFAR-shaped data sets: the CIFAR-10 binary reader on small generated batch files, and the
// synthetic data set.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data_test_support.h"
#include "dtrain/train/data/dataset.h"

namespace dtrain::train {
namespace {

using testing::Bytes;
using testing::ExpectErrorMentioning;
using testing::TempDir;
using testing::WriteFile;

constexpr size_t kRecordBytes = 1 + 3 * 32 * 32;
constexpr double kMean[3] = {0.4914, 0.4822, 0.4465};
constexpr double kStd[3] = {0.2470, 0.2435, 0.2616};

// Records whose labels are `labels`; record r has pixel p = (r * 31 + p) % 256 (label byte first).
Bytes Records(const std::vector<uint8_t>& labels, int first_record = 0) {
  Bytes out;
  for (size_t r = 0; r < labels.size(); ++r) {
    out.push_back(labels[r]);
    for (size_t p = 0; p < kRecordBytes - 1; ++p) {
      out.push_back(static_cast<uint8_t>((first_record + r) * 31 + p));
    }
  }
  return out;
}

double Normalised(int record, int channel, int y, int x) {
  const int pixel = channel * 1024 + y * 32 + x;
  return (static_cast<uint8_t>(record * 31 + pixel) / 255.0 - kMean[channel]) / kStd[channel];
}

// Writes data_batch_1..5.bin with two records each (labels 2k-2, 2k-1 mod 10) and test_batch.bin
// with three, into `dir`.
void WriteCifar(const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (int k = 1; k <= 5; ++k) {
    const uint8_t a = static_cast<uint8_t>((2 * k - 2) % 10), b = static_cast<uint8_t>(2 * k - 1);
    WriteFile(dir + "/data_batch_" + std::to_string(k) + ".bin", Records({a, b}, 2 * k - 2));
  }
  WriteFile(dir + "/test_batch.bin", Records({3, 9, 0}));
}

TEST(Cifar10Test, TestBatchLoadsWithPerChannelNormalisation) {
  TempDir tmp;
  WriteCifar(tmp.str());
  const ImageDataset data = LoadDataset("cifar10", tmp.str(), Split::kTest);
  ASSERT_EQ(data.size(), 3);
  EXPECT_EQ(data.num_classes, 10);
  EXPECT_EQ(data.images.sizes(), (std::vector<int64_t>{3, 3, 32, 32}));
  EXPECT_EQ(data.images.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(data.labels[0].item<int64_t>(), 3);
  EXPECT_EQ(data.labels[1].item<int64_t>(), 9);
  EXPECT_EQ(data.labels[2].item<int64_t>(), 0);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      for (auto [y, x] : {std::pair{0, 0}, {0, 31}, {5, 7}, {31, 31}}) {
        EXPECT_NEAR(data.images[r][c][y][x].item<double>(), Normalised(r, c, y, x), 1e-5)
            << "record " << r << " channel " << c << " at " << y << "," << x;
      }
    }
  }
}

TEST(Cifar10Test, TrainSplitConcatenatesTheFiveBatchesInOrder) {
  TempDir tmp;
  WriteCifar(tmp.str());
  const ImageDataset data = LoadDataset("cifar10", tmp.str(), Split::kTrain);
  ASSERT_EQ(data.size(), 10);
  for (int r = 0; r < 10; ++r) {
    EXPECT_EQ(data.labels[r].item<int64_t>(), r % 10);
    EXPECT_NEAR(data.images[r][2][31][0].item<double>(), Normalised(r, 2, 31, 0), 1e-5);
  }
}

TEST(Cifar10Test, FilesInsideCifar10BatchesBinSubfolder) {
  TempDir tmp;
  WriteCifar(tmp / "cifar-10-batches-bin");
  EXPECT_EQ(LoadDataset("cifar10", tmp.str(), Split::kTest).size(), 3);
  EXPECT_EQ(LoadDataset("cifar10", tmp / "cifar-10-batches-bin", Split::kTrain).size(), 10);
}

TEST(Cifar10Test, TruncatedRecord) {
  TempDir tmp;
  WriteCifar(tmp.str());
  Bytes bytes = Records({1, 2});
  bytes.erase(bytes.end() - 100, bytes.end());
  WriteFile(tmp / "data_batch_4.bin", bytes);
  ExpectErrorMentioning([&] { LoadDataset("cifar10", tmp.str(), Split::kTrain); },
                        {tmp / "data_batch_4.bin", "6046 bytes", "3073-byte records", "truncated"});
}

TEST(Cifar10Test, EmptyFile) {
  TempDir tmp;
  WriteCifar(tmp.str());
  WriteFile(tmp / "test_batch.bin", {});
  ExpectErrorMentioning([&] { LoadDataset("cifar10", tmp.str(), Split::kTest); },
                        {tmp / "test_batch.bin", "empty"});
}

TEST(Cifar10Test, LabelOutOfRange) {
  TempDir tmp;
  WriteCifar(tmp.str());
  WriteFile(tmp / "test_batch.bin", Records({1, 2, 10}));
  ExpectErrorMentioning([&] { LoadDataset("cifar10", tmp.str(), Split::kTest); },
                        {tmp / "test_batch.bin", "label 10 of record 2", "out of range"});
}

TEST(Cifar10Test, MissingBatchFileIsNamed) {
  TempDir tmp;
  WriteCifar(tmp.str());
  std::filesystem::remove(tmp / "data_batch_3.bin");
  ExpectErrorMentioning([&] { LoadDataset("cifar10", tmp.str(), Split::kTrain); },
                        {tmp / "data_batch_3.bin", "not found", "cifar-10-binary.tar.gz"});
}

TEST(Cifar10Test, MissingDirectorySaysWhereToGetTheData) {
  TempDir tmp;
  ExpectErrorMentioning([&] { LoadDataset("cifar10", tmp / "none", Split::kTest); },
                        {tmp / "none", "does not exist", "cifar-10-binary.tar.gz"});
  ExpectErrorMentioning([&] { LoadDataset("cifar10", tmp.str(), Split::kTest); },
                        {"test_batch.bin", "not found", "cifar-10-batches-bin"});
}

// ---- Synthetic ----

TEST(SyntheticTest, ShapesLabelsAndScale) {
  const ImageDataset data = SyntheticDataset(Split::kTrain, 7, 2000);
  ASSERT_EQ(data.size(), 2000);
  EXPECT_EQ(data.num_classes, 10);
  EXPECT_EQ(data.images.sizes(), (std::vector<int64_t>{2000, 3, 32, 32}));
  EXPECT_EQ(data.images.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data.labels.scalar_type(), torch::kInt64);
  const auto counts = torch::bincount(data.labels, {}, 10);
  ASSERT_EQ(counts.size(0), 10);
  for (int64_t c = 0; c < 10; ++c) EXPECT_GT(counts[c].item<int64_t>(), 150) << "class " << c;
  EXPECT_NEAR(data.images.mean().item<double>(), 0.0, 0.05);
  EXPECT_NEAR(data.images.std().item<double>(), 1.0, 0.05);
}

TEST(SyntheticTest, DeterministicBySeed) {
  const ImageDataset a = SyntheticDataset(Split::kTrain, 42, 64);
  const ImageDataset b = SyntheticDataset(Split::kTrain, 42, 64);
  EXPECT_TRUE(torch::equal(a.images, b.images));
  EXPECT_TRUE(torch::equal(a.labels, b.labels));
  // The first examples do not depend on how many are made.
  const ImageDataset prefix = SyntheticDataset(Split::kTrain, 42, 10);
  EXPECT_TRUE(torch::equal(prefix.images, a.images.narrow(0, 0, 10)));
  EXPECT_TRUE(torch::equal(prefix.labels, a.labels.narrow(0, 0, 10)));
}

TEST(SyntheticTest, DifferentSeedsAndSplitsGiveDifferentData) {
  const ImageDataset a = SyntheticDataset(Split::kTrain, 1, 64);
  const ImageDataset b = SyntheticDataset(Split::kTrain, 2, 64);
  const ImageDataset test = SyntheticDataset(Split::kTest, 1, 64);
  EXPECT_FALSE(torch::equal(a.images, b.images));
  EXPECT_FALSE(torch::equal(a.labels, b.labels));
  EXPECT_FALSE(torch::equal(a.images, test.images));
  EXPECT_FALSE(torch::equal(a.labels, test.labels));
}

// Class means estimated on the training split classify the test split: both splits share the
// per-class patterns, so a network can learn something.
TEST(SyntheticTest, LabelsAreLearnableAcrossSplits) {
  const ImageDataset train = SyntheticDataset(Split::kTrain, 3, 1000);
  const ImageDataset test = SyntheticDataset(Split::kTest, 3, 500);
  const auto x = train.images.reshape({train.size(), -1});
  const auto one_hot = torch::one_hot(train.labels, 10).to(torch::kFloat32);  // (N, 10)
  const auto means = one_hot.t().mm(x) / one_hot.sum(0).unsqueeze(1);         // (10, 3072)
  const auto scores = test.images.reshape({test.size(), -1}).mm(means.t()) -
                      0.5 * (means * means).sum(1).unsqueeze(0);
  const double accuracy =
      scores.argmax(1).eq(test.labels).to(torch::kFloat32).mean().item<double>();
  EXPECT_GT(accuracy, 0.9);
}

TEST(SyntheticTest, LoadDatasetGivesCifarSizes) {
  const ImageDataset test = LoadDataset("synthetic", "ignored", Split::kTest, 5);
  EXPECT_EQ(test.size(), kSyntheticTestSize);
  EXPECT_EQ(kSyntheticTestSize, 10000);
  EXPECT_EQ(test.images.sizes(), (std::vector<int64_t>{10000, 3, 32, 32}));
  EXPECT_TRUE(
      torch::equal(test.images.narrow(0, 0, 8), SyntheticDataset(Split::kTest, 5, 8).images));
  const ImageDataset train = LoadDataset("synthetic", "", Split::kTrain, 5);
  EXPECT_EQ(train.size(), 50000);
  EXPECT_EQ(kSyntheticTrainSize, 50000);
}

TEST(SyntheticTest, NeedsAtLeastOneExample) {
  ExpectErrorMentioning<InvalidArgument>([] { SyntheticDataset(Split::kTrain, 0, 0); },
                                         {"num_examples"});
}

}  // namespace
}  // namespace dtrain::train

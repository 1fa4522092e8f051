// SplitSampler (MXNet semantics: equal contiguous parts, reshuffled per epoch) and SplitBatch
// (a batch over local devices, evenly or by work_load weights).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "data_test_support.h"
#include "dtrain/train/data/dataset.h"

namespace dtrain::train {
namespace {

using testing::ExpectErrorMentioning;

using Slices = std::vector<std::pair<int64_t, int64_t>>;

std::vector<int64_t> Sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> Range(int64_t start, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(SplitSamplerTest, PartsAreDisjointEqualAndCoverLengthMinusRemainder) {
  constexpr int64_t kLength = 1003;
  constexpr int kParts = 4;
  std::vector<int64_t> all;
  for (int part = 0; part < kParts; ++part) {
    const SplitSampler sampler(kLength, kParts, part, /*seed=*/11);
    ASSERT_EQ(sampler.size(), 250);
    const std::vector<int64_t> indices = sampler.EpochIndices(0);
    ASSERT_EQ(indices.size(), 250u);
    // MXNet: part_length = length / num_parts, start = part_length * part_index.
    EXPECT_EQ(Sorted(indices), Range(250 * part, 250)) << "part " << part;
    all.insert(all.end(), indices.begin(), indices.end());
  }
  EXPECT_EQ(Sorted(all), Range(0, 1000));  // the last 3 items are dropped
}

TEST(SplitSamplerTest, ReshuffledEveryEpochAndReproducible) {
  const SplitSampler sampler(500, 2, 1, /*seed=*/3);
  const std::vector<int64_t> epoch0 = sampler.EpochIndices(0);
  const std::vector<int64_t> epoch1 = sampler.EpochIndices(1);
  EXPECT_NE(epoch0, Range(250, 250)) << "not shuffled";
  EXPECT_NE(epoch0, epoch1) << "same order in two epochs";
  EXPECT_EQ(Sorted(epoch1), Range(250, 250));
  // The same (seed, epoch) gives the same order, in this object or a new one.
  EXPECT_EQ(sampler.EpochIndices(0), epoch0);
  EXPECT_EQ(SplitSampler(500, 2, 1, 3).EpochIndices(1), epoch1);
  // Another seed gives another order.
  EXPECT_NE(SplitSampler(500, 2, 1, 4).EpochIndices(0), epoch0);
  // Every epoch of ten differs from every other.
  std::set<std::vector<int64_t>> orders;
  for (int epoch = 0; epoch < 10; ++epoch) orders.insert(sampler.EpochIndices(epoch));
  EXPECT_EQ(orders.size(), 10u);
}

TEST(SplitSamplerTest, WithoutShuffleInOrder) {
  const SplitSampler sampler(10, 3, 2, /*seed=*/0, /*shuffle=*/false);
  EXPECT_EQ(sampler.size(), 3);
  EXPECT_EQ(sampler.EpochIndices(0), Range(6, 3));
  EXPECT_EQ(sampler.EpochIndices(5), Range(6, 3));
}

TEST(SplitSamplerTest, OnePartIsTheWholeDataSet) {
  const SplitSampler sampler(7, 1, 0, /*seed=*/9);
  EXPECT_EQ(sampler.size(), 7);
  EXPECT_EQ(Sorted(sampler.EpochIndices(2)), Range(0, 7));
}

TEST(SplitSamplerTest, InvalidArguments) {
  ExpectErrorMentioning<InvalidArgument>([] { SplitSampler(10, 0, 0, 0); }, {"num_parts", "0"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitSampler(10, 2, 2, 0); },
                                         {"part_index 2", "[0, 2)"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitSampler(10, 2, -1, 0); }, {"part_index -1"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitSampler(3, 4, 0, 0); }, {"3 items", "4 parts"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitSampler(-5, 1, 0, 0); }, {"-5 items"});
}

TEST(SplitBatchTest, EvenSplitGivesEarlierDevicesTheExtra) {
  EXPECT_EQ(SplitBatch(8, 2), (Slices{{0, 4}, {4, 4}}));
  EXPECT_EQ(SplitBatch(10, 3), (Slices{{0, 4}, {4, 3}, {7, 3}}));
  EXPECT_EQ(SplitBatch(11, 4), (Slices{{0, 3}, {3, 3}, {6, 3}, {9, 2}}));
  EXPECT_EQ(SplitBatch(5, 5), (Slices{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}}));
  EXPECT_EQ(SplitBatch(64, 1), (Slices{{0, 64}}));
}

TEST(SplitBatchTest, WeightedSplit) {
  EXPECT_EQ(SplitBatch(8, 2, {3, 1}), (Slices{{0, 6}, {6, 2}}));
  EXPECT_EQ(SplitBatch(10, 2, {1, 2}), (Slices{{0, 3}, {3, 7}}));
  // Equal weights agree with the even split.
  EXPECT_EQ(SplitBatch(10, 3, {1, 1, 1}), SplitBatch(10, 3));
  // Shares 3.5, 1.75, 1.75: floors 3, 1, 1; the two left over go to the largest remainders.
  EXPECT_EQ(SplitBatch(7, 3, {0.5, 0.25, 0.25}), (Slices{{0, 3}, {3, 2}, {5, 2}}));
}

TEST(SplitBatchTest, WeightedSizesAddUpAndStayWithinOneOfTheShares) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> weight(1.0, 4.0);  // every share at least 3
  for (int trial = 0; trial < 1000; ++trial) {
    const int devices = 1 + static_cast<int>(rng() % 8);
    const int64_t batch = 100 + static_cast<int64_t>(rng() % 500);
    std::vector<double> w(static_cast<size_t>(devices));
    for (double& x : w) x = weight(rng);
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    const Slices slices = SplitBatch(batch, devices, w);
    ASSERT_EQ(slices.size(), static_cast<size_t>(devices));
    int64_t offset = 0;
    for (int d = 0; d < devices; ++d) {
      EXPECT_EQ(slices[d].first, offset);
      EXPECT_LT(std::abs(static_cast<double>(slices[d].second) - batch * w[d] / total), 1.0);
      offset += slices[d].second;
    }
    EXPECT_EQ(offset, batch);
  }
}

TEST(SplitBatchTest, InvalidArguments) {
  ExpectErrorMentioning<InvalidArgument>([] { SplitBatch(8, 0); }, {"num_devices"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitBatch(3, 4); }, {"batch of 3", "4 devices"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitBatch(0, 1); }, {"batch of 0"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitBatch(8, 2, {1}); },
                                         {"1 work_load weights for 2 devices"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitBatch(8, 2, {1, 2, 3}); }, {"3 work_load"});
  ExpectErrorMentioning<InvalidArgument>(
      [] {
        SplitBatch(8, 2, {1, 0});
      },
      {"work_load[1]", "positive"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitBatch(8, 2, {-1, 1}); }, {"work_load[0]"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitBatch(8, 2, {NAN, 1}); }, {"work_load[0]"});
  ExpectErrorMentioning<InvalidArgument>([] { SplitBatch(8, 2, {INFINITY, 1}); }, {"work_load[0]"});
  // Shares 1.98 and 0.02: the second device would get nothing.
  ExpectErrorMentioning<InvalidArgument>(
      [] {
        SplitBatch(2, 2, {99, 1});
      },
      {"device 1", "none of the 2"});
}

}  // namespace
}  // namespace dtrain::train

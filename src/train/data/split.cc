// SplitSampler (the data set over workers) and SplitBatch (a batch over local devices).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/train/data/dataset.h"
#include "train/data/formats.h"

namespace dtrain::train {

SplitSampler::SplitSampler(int64_t length, int num_parts, int part_index, uint64_t seed,
                           bool shuffle)
    : seed_(seed), shuffle_(shuffle) {
  if (num_parts < 1) {
    throw InvalidArgument("SplitSampler: num_parts must be at least 1, got " +
                          std::to_string(num_parts));
  }
  if (part_index < 0 || part_index >= num_parts) {
    throw InvalidArgument("SplitSampler: part_index " + std::to_string(part_index) +
                          " is outside [0, " + std::to_string(num_parts) + ")");
  }
  if (length < num_parts) {
    throw InvalidArgument("SplitSampler: " + std::to_string(length) +
                          " items cannot give each of " + std::to_string(num_parts) +
                          " parts at least one");
  }
  part_length_ = length / num_parts;
  start_ = part_length_ * part_index;
}

std::vector<int64_t> SplitSampler::EpochIndices(int epoch) const {
  std::vector<int64_t> indices(static_cast<size_t>(part_length_));
  std::iota(indices.begin(), indices.end(), start_);
  if (shuffle_) {
    std::mt19937_64 rng(
        data_internal::MixSeed(seed_, static_cast<uint64_t>(static_cast<int64_t>(epoch))));
    std::shuffle(indices.begin(), indices.end(), rng);
  }
  return indices;
}

std::vector<std::pair<int64_t, int64_t>> SplitBatch(int64_t batch_size, int num_devices,
                                                    const std::vector<double>& work_load) {
  if (num_devices < 1) {
    throw InvalidArgument("SplitBatch: num_devices must be at least 1, got " +
                          std::to_string(num_devices));
  }
  if (batch_size < num_devices) {
    throw InvalidArgument("SplitBatch: a batch of " + std::to_string(batch_size) +
                          " cannot be split over " + std::to_string(num_devices) + " devices");
  }
  std::vector<int64_t> sizes(static_cast<size_t>(num_devices), batch_size / num_devices);
  if (work_load.empty()) {
    for (int64_t i = 0; i < batch_size % num_devices; ++i) ++sizes[i];
  } else {
    if (work_load.size() != static_cast<size_t>(num_devices)) {
      throw InvalidArgument("SplitBatch: " + std::to_string(work_load.size()) +
                            " work_load weights for " + std::to_string(num_devices) + " devices");
    }
    double total = 0;
    for (size_t i = 0; i < work_load.size(); ++i) {
      if (!(work_load[i] > 0) || !std::isfinite(work_load[i])) {
        throw InvalidArgument("SplitBatch: work_load[" + std::to_string(i) + "] is " +
                              std::to_string(work_load[i]) + "; weights must be positive");
      }
      total += work_load[i];
    }
    // Largest remainder: floors first, then one more each to the largest fractional parts.
    std::vector<double> fraction(work_load.size());
    int64_t assigned = 0;
    for (size_t i = 0; i < work_load.size(); ++i) {
      const double share = static_cast<double>(batch_size) * (work_load[i] / total);
      sizes[i] = std::min(static_cast<int64_t>(std::floor(share)), batch_size);
      fraction[i] = share - static_cast<double>(sizes[i]);
      assigned += sizes[i];
    }
    std::vector<size_t> order(work_load.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return fraction[a] > fraction[b]; });
    // The fractional parts add up to batch_size - assigned < num_devices (up to rounding, which
    // the modulo absorbs).
    for (int64_t k = 0; assigned < batch_size; ++k, ++assigned) ++sizes[order[k % order.size()]];
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == 0) {
        throw InvalidArgument("SplitBatch: with work_load weights this uneven, device " +
                              std::to_string(i) + " would get none of the " +
                              std::to_string(batch_size) + " samples");
      }
    }
  }
  std::vector<std::pair<int64_t, int64_t>> slices;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    slices.emplace_back(offset, size);
    offset += size;
  }
  return slices;
}

}  // namespace dtrain::train

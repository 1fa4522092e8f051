// The "synthetic" data set: CIFAR-shaped images for benchmarks, made from the seed alone.
//
// Every value comes from a counter-based generator (the splitmix64 finaliser applied to key + i *
// golden ratio), so element i does not depend on how the work is split over threads, and the data
// are the same on every machine and every run for a given (seed, split, size). Each image is
// 0.3 * template[label] + 0.95 * noise, with one fixed template per class (from the seed, shared by
// both splits) and uniform noise of unit variance: mean about 0 and variance about 1 like the
// normalised real data sets, and a signal a network can learn, so a training run's loss falls.
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "dtrain/common/error.h"
#include "train/data/formats.h"

namespace dtrain::train {
namespace {

using data_internal::Finalize64;
using data_internal::kGolden64;
using data_internal::MixSeed;

constexpr int64_t kChannels = 3;
constexpr int64_t kSide = 32;
constexpr int64_t kPixels = kChannels * kSide * kSide;
constexpr int64_t kNumClasses = 10;
constexpr float kSignal = 0.3f;
const float kNoise = std::sqrt(1.0f - kSignal * kSignal);

// The i-th 64-bit value of the stream `key`.
uint64_t Draw(uint64_t key, uint64_t i) { return Finalize64(key + (i + 1) * kGolden64); }

// Uniform on [-sqrt(3), sqrt(3)) (mean 0, variance 1) from the top 24 of 32 bits.
float UnitUniform(uint32_t bits) {
  constexpr float kHalfWidth = 1.7320508075688772f;
  return ((bits >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * kHalfWidth;
}

// Fills n floats from stream `key`, two per 64-bit value. n must be even.
void FillUniform(float* dst, int64_t n, uint64_t key) {
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t v = Draw(key, static_cast<uint64_t>(i / 2));
    dst[i] = UnitUniform(static_cast<uint32_t>(v));
    dst[i + 1] = UnitUniform(static_cast<uint32_t>(v >> 32));
  }
}

}  // namespace

ImageDataset SyntheticDataset(Split split, uint64_t seed, int64_t num_examples) {
  if (num_examples < 1) {
    throw InvalidArgument("synthetic: num_examples must be at least 1, got " +
                          std::to_string(num_examples));
  }
  const uint64_t template_key = MixSeed(seed, 0x7e3a1a7e);
  const uint64_t split_key = MixSeed(seed, split == Split::kTrain ? 1 : 2);
  const uint64_t label_key = MixSeed(split_key, 0x1abe1);
  const uint64_t noise_key = MixSeed(split_key, 0x9015e);

  std::vector<float> templates(kNumClasses * kPixels);
  FillUniform(templates.data(), static_cast<int64_t>(templates.size()), template_key);

  ImageDataset out;
  out.num_classes = kNumClasses;
  out.labels = torch::empty({num_examples}, torch::kInt64);
  out.images = torch::empty({num_examples, kChannels, kSide, kSide}, torch::kFloat32);
  int64_t* labels = out.labels.data_ptr<int64_t>();
  float* images = out.images.data_ptr<float>();
  at::parallel_for(0, num_examples, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      labels[i] = static_cast<int64_t>(Draw(label_key, i) % kNumClasses);
      float* image = images + i * kPixels;
      FillUniform(image, kPixels, MixSeed(noise_key, i));
      const float* tmpl = templates.data() + labels[i] * kPixels;
      for (int64_t j = 0; j < kPixels; ++j) image[j] = kSignal * tmpl[j] + kNoise * image[j];
    }
  });
  return out;
}

}  // namespace dtrain::train

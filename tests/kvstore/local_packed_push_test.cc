// A "device" store given values its caller compressed (PackedPushes, as CUDA values compressed on
// their GPUs reach it): the same bits as the values it compresses itself, the checks that refuse
// what does not fit, and which pushes qualify. The GPU side runs in tests/cuda.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "dtrain/common/error.h"
#include "kv_test_support.h"
#include "kvstore/local_kvstore.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

using kvtest::InvalidArgumentFrom;
using kvtest::PullVector;

constexpr int64_t kN = 1003;  // not a multiple of a word; its threads' ranges start mid-array

Config ThreadedSums() {
  Config config;
  config.bigarray_bound = 100;
  config.reduction_threads = 3;
  return config;
}

// Value `d` of round `round`: varied signs and sizes, so every code of every format appears.
Array Gradient(int round, int d) {
  Array a({kN});
  auto f = a.floats();
  for (int64_t i = 0; i < kN; ++i) {
    f[i] = 0.37f * static_cast<float>((i * 7 + round * 13 + d * 5) % 17 - 8) / 8.0f;
  }
  return a;
}

// A host array of `bytes` bytes (every compressed size is even), as the staging store makes them.
Array PackedArray(size_t bytes) {
  return Array({static_cast<int64_t>(bytes / 2)}, DType::kFloat16);
}

// `values` compressed as the store's caller would, each with its own residual.
std::vector<Array> Packed(const CompressionSpec& spec, const std::vector<Array>& values,
                          std::vector<std::vector<float>>& residuals) {
  residuals.resize(values.size(), std::vector<float>(kN, 0.0f));
  std::vector<Array> packed;
  for (size_t d = 0; d < values.size(); ++d) {
    Array words = PackedArray(CompressedBytes(spec.type, kN));
    Compress(spec, values[d].floats().data(), residuals[d].data(), kN, words.data());
    packed.push_back(words);
  }
  return packed;
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

class LocalPackedPushTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LocalPackedPushTest, ValuesCompressedByTheCallerGiveTheStoresOwnBits) {
  const std::map<std::string, std::string> params = {{"type", GetParam()}};
  for (bool optimizer : {false, true}) {
    SCOPED_TRACE(optimizer ? "with adam" : "without an optimizer");
    LocalKVStore own("device", ThreadedSums()), packed("device", ThreadedSums());
    for (LocalKVStore* kv : {&own, &packed}) {
      kv->SetGradientCompression(params);
      if (optimizer) kv->SetOptimizer({"adam", {{"learning_rate", 0.01}}});
      kv->Init(7, Gradient(9, 9));
    }
    const CompressionSpec spec = own.gradient_compression();
    std::vector<std::vector<float>> residuals;
    for (int round = 0; round < 4; ++round) {
      const std::vector<Array> values = {Gradient(round, 0), Gradient(round, 1),
                                         Gradient(round, 2)};
      Array pulled({kN});
      if (round % 2 == 0) {
        own.Push(7, values);
        packed.PushPacked(7, spec, Packed(spec, values, residuals), {}).Wait();
        packed.Pull(7, {pulled}).Wait();
      } else {
        own.PushPull(7, values, {Array({kN})}).Wait();
        packed.PushPacked(7, spec, Packed(spec, values, residuals), {pulled}).Wait();
      }
      const std::vector<float> expected = PullVector(own, 7, {kN});
      const auto got = pulled.floats();
      ASSERT_EQ(Bits(std::vector<float>(got.begin(), got.end())), Bits(expected))
          << "round " << round;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, LocalPackedPushTest,
                         ::testing::Values("2bit", "1bit", "fp16"));

TEST(LocalPackedPushRefusalTest, WhatDoesNotFitIsRefusedAndChangesNothing) {
  LocalKVStore kv("device");
  kv.SetGradientCompression({{"type", "2bit"}, {"threshold", "0.5"}, {"min_elements", "64"}});
  const CompressionSpec spec = kv.gradient_compression();
  kv.Init(1, Array::FromFloats(std::vector<float>(kN, 2.0f)));
  kv.Init(2, Array({10}));                   // below min_elements: sent as it is
  kv.Init(3, Array({kN}, DType::kFloat64));  // not float32
  const Array right = PackedArray(CompressedBytes(spec.type, kN));

  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPacked(1, spec, {}, {}); }),
              HasSubstr("Push of key 1: no compressed values given"));
  EXPECT_THAT(InvalidArgumentFrom([&] {
                kv.PushPacked(1, spec, {right, PackedArray(4)}, {});
              }),
              HasSubstr("its 1003 values take 252 bytes, the packed array holds 4"));
  CompressionSpec other = spec;
  other.threshold = 0.25f;
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPacked(1, other, {right}, {}); }),
              HasSubstr("the store compresses with 2bit"));
  other = spec;
  other.type = Compression::kOneBit;
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPacked(1, other, {right}, {}); }),
              HasSubstr("the store compresses with 2bit"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPacked(2, spec, {PackedArray(4)}, {}); }),
              HasSubstr("the store sends this key (10 elements) uncompressed"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPacked(3, spec, {right}, {}); }),
              HasSubstr("gradient compression works on float32 values, the key holds float64"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPacked(1, spec, {right}, {Array({5})}); }),
              HasSubstr("PushPull of key 1: out 0 has shape (5,) float32"));
  EXPECT_THAT(InvalidArgumentFrom([&] { kv.PushPacked(4, spec, {right}, {}); }),
              HasSubstr("key 4 was never initialised"));
  EXPECT_EQ(PullVector(kv, 1, {kN}), std::vector<float>(kN, 2.0f));

  // Compression can still be changed: nothing was pushed.
  kv.SetGradientCompression({{"type", "fp16"}});
}

// (Which device values qualify needs a GPU: tests/cuda/device_store_compression_test.cc.)
TEST(LocalPackedPushRefusalTest, HostValuesNeverQualify) {
  LocalKVStore device("device"), local("local");
  const std::vector<Array> host_values = {Array({kN}), Array({kN})};
  for (LocalKVStore* kv : {&device, &local}) {
    EXPECT_FALSE(kv->CompressesEachOnDevice(host_values)) << kv->type();
    kv->SetGradientCompression({{"type", "2bit"}});
    EXPECT_FALSE(kv->CompressesEachOnDevice(host_values)) << kv->type();
  }
}

}  // namespace
}  // namespace dtrain

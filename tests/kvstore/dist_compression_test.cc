// Gradient compression through whole dist jobs in one process (scheduler, servers and workers as
// threads over the in-memory transport): MXNet's expectations for 2-bit and 1-bit, random
// gradients against a quantizer simulated here for every worker (bit for bit), keys on both sides
// of the big-array bound with sizes that are not multiples of 16, init values uncompressed, and
// the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression_job_support.h"
#include "dtrain/common/array.h"
#include "inprocess_job.h"
#include "support/invalid_argument_from.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

// Around the bound (1000 elements) and the slots (1024 bytes: 256 floats): whole keys in one or
// several slots, and keys split over every server; none a multiple of 16.
const std::vector<int64_t> kSizes = {7, 257, 999, 1001, 2061, 10007};

Array Constant(int64_t n, float value) {
  Array a({n});
  a.Fill(value);
  return a;
}

void InitAll(DistKVStore& kv) {
  std::vector<Key> keys;
  std::vector<Array> values;
  for (size_t k = 0; k < kSizes.size(); ++k) {
    keys.push_back(static_cast<Key>(k));
    values.push_back(Array({kSizes[k]}));
  }
  kv.Init(keys, values);
}

// Every worker pushes `pushes[s]` to every key in step s (alternating push + pull and pushpull);
// every element of every pull must be `sums[s]`.
void ExpectSums(DistKVStore& kv, const std::vector<float>& pushes, const std::vector<float>& sums) {
  for (size_t s = 0; s < pushes.size(); ++s) {
    for (size_t k = 0; k < kSizes.size(); ++k) {
      Array out({kSizes[k]});
      if (s % 2 == 0) {
        kv.PushPull(static_cast<Key>(k), {Constant(kSizes[k], pushes[s])}, {out}).Wait();
      } else {
        kv.Push(static_cast<Key>(k), {Constant(kSizes[k], pushes[s])});
        kv.Pull(static_cast<Key>(k), {out}).Wait();
      }
      for (int64_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out.floats()[i], sums[s])
            << "step " << s << ", key of " << kSizes[k] << ", element " << i;
      }
    }
  }
}

class DistCompressionTest : public ::testing::TestWithParam<Layout> {};

TEST_P(DistCompressionTest, TwoBitGivesMXNetsSums) {
  const int n = GetParam().workers;
  InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
  job.Run([&](DistKVStore& kv) {
    kv.SetGradientCompression({{"type", "2bit"}, {"threshold", "0.5"}});
    InitAll(kv);
    const float t = 0.5f * static_cast<float>(n);
    ExpectSums(kv, {0, 0.4f, 0.1f, 0.2f, 0.3f, 0.5f}, {0, 0, t, 0, t, t});
  });
  job.ExpectSuccess();
}

TEST_P(DistCompressionTest, OneBitGivesMXNetsSums) {
  const int n = GetParam().workers;
  InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
  job.Run([&](DistKVStore& kv) {
    kv.SetGradientCompression({{"type", "1bit"}, {"threshold", "0"}});
    InitAll(kv);
    const float m = static_cast<float>(n);
    ExpectSums(kv, {1, -1, 2, 0, -2}, {m, -m, m, m, -m});
  });
  job.ExpectSuccess();
}

// min_elements spares small keys: they sum exactly while the big ones are quantized.
TEST(DistCompression, KeysUnderMinElementsTravelUncompressed) {
  InProcessJob job("dist_sync", SmallSlots(2, 2));
  job.Run([&](DistKVStore& kv) {
    kv.SetGradientCompression({{"type", "2bit"}, {"threshold", "0.5"}, {"min_elements", "1001"}});
    InitAll(kv);
    for (size_t k = 0; k < kSizes.size(); ++k) {
      Array out({kSizes[k]});
      kv.PushPull(static_cast<Key>(k), {Constant(kSizes[k], 0.3f)}, {out}).Wait();
      // Uncompressed: 0.3 from each of the 2 workers; 2-bit: below the threshold, nothing yet.
      const float want = kSizes[k] < 1001 ? 0.6f : 0.0f;
      for (int64_t i = 0; i < out.size(); ++i) {
        ASSERT_FLOAT_EQ(out.floats()[i], want) << "key of " << kSizes[k] << ", element " << i;
      }
    }
  });
  job.ExpectSuccess();
}

TEST_P(DistCompressionTest, RandomGradientsSumAsASimulatedQuantizerSaysBitForBit) {
  const int n = GetParam().workers;
  for (const std::string type : {"2bit", "1bit", "fp16"}) {
    SCOPED_TRACE(type);
    InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
    job.Run([&](DistKVStore& kv) {
      const CompressionSpec spec = CompressionSpec::FromParams({{"type", type}});
      kv.SetGradientCompression({{"type", type}});
      InitAll(kv);
      SimulatedQuantizers quantizers(spec, n, kSizes);
      for (int step = 0; step < 4; ++step) {
        for (size_t k = 0; k < kSizes.size(); ++k) {
          const int64_t size = kSizes[k];
          const std::vector<float> want = quantizers.Sum(step, k);
          const auto mine = Gradient(kv.rank(), step, size, spec.type);
          Array out({size});
          kv.PushPull(static_cast<Key>(k), {Array::FromFloats(mine, {size})}, {out}).Wait();
          for (int64_t i = 0; i < size; ++i) {
            ASSERT_EQ(out.floats()[i], want[i]) << "step " << step << " key " << k << " i " << i;
          }
        }
      }
    });
    job.ExpectSuccess();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistCompressionTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 1}, Layout{2, 3}, Layout{3, 2},
                                           Layout{4, 3}),
                         LayoutName);

TEST(DistCompression, InitValuesArriveUncompressed) {
  InProcessJob job("dist_sync", SmallSlots(2, 2));
  job.Run([&](DistKVStore& kv) {
    kv.SetGradientCompression({{"type", "2bit"}});
    kv.Init(3, Constant(1001, 0.1234f));
    Array out({1001});
    kv.Pull(3, {out}).Wait();
    for (float v : out.floats()) ASSERT_EQ(v, 0.1234f);
  });
  job.ExpectSuccess();
}

TEST(DistCompression, WorksWithTheOptimizerOnTheServersAndInAsyncMode) {
  for (const std::string type : {"dist_sync", "dist_async"}) {
    SCOPED_TRACE(type);
    InProcessJob job(type, SmallSlots(2, 2));
    job.Run([&](DistKVStore& kv) {
      kv.SetGradientCompression({{"type", "2bit"}, {"threshold", "0.25"}});
      kv.Init(0, Constant(1001, 1.0f));
      kv.SetOptimizer({"sgd", {{"learning_rate", 1.0}}});
      kv.Push(0, {Constant(1001, 0.3f)}).Wait();  // each sends 0.25
      kv.Barrier();
      Array out({1001});
      kv.Pull(0, {out}).Wait();
      for (float v : out.floats()) ASSERT_EQ(v, 0.5f);  // 1 - 2 x 0.25
    });
    job.ExpectSuccess();
  }
}

TEST(DistCompression, MisuseIsAClearErrorAndChangesNothing) {
  InProcessJob job("dist_sync", SmallSlots(1, 1));
  job.Run([&](DistKVStore& kv) {
    EXPECT_THAT(test_support::InvalidArgumentFrom([&] {
                  kv.SetGradientCompression({{"type", "2bit"}, {"threshold", "-1"}});
                }),
                HasSubstr("threshold > 0"));
    EXPECT_THAT(test_support::InvalidArgumentFrom([&] {
                  kv.SetGradientCompression({{"type", "4bit"}});
                }),
                HasSubstr("unknown gradient compression type '4bit'"));
    kv.SetGradientCompression({{"type", "2bit"}});
    kv.Init(1, Array({5}, DType::kFloat64));
    EXPECT_THAT(
        test_support::InvalidArgumentFrom([&] { kv.Push(1, {Array({5}, DType::kFloat64)}); }),
        HasSubstr("float32"));
    kv.Init(2, Array({5}));
    kv.Push(2, {Constant(5, 0.5f)}).Wait();
    EXPECT_THAT(test_support::InvalidArgumentFrom([&] {
                  kv.SetGradientCompression({{"type", "none"}});
                }),
                HasSubstr("before the first push"));
  });
  job.ExpectSuccess();
}

}  // namespace
}  // namespace dtrain::testing

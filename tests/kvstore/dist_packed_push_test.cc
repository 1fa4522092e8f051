// Packed pushes (StagedCalls::PushPacked) through whole dist jobs in one process: values a worker
// compressed itself (as the kvstore's staging does on a GPU) sum exactly as the store's own
// compressed pushes do, in every mix of the two across workers and steps, with keys split over
// several servers; and every misuse is an error at the call that changes nothing.
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

// On both sides of the big-array bound (1000 elements) and the slots (256 floats); none a
// multiple of 16.
const std::vector<int64_t> kSizes = {257, 1001, 10007};

// The bytes of `values` compressed with `spec`, in an Array as the staging hands them on.
Array Packed(const CompressionSpec& spec, const std::vector<float>& values,
             std::vector<float>& residual) {
  const auto n = static_cast<int64_t>(values.size());
  Array packed({static_cast<int64_t>(CompressedBytes(spec.type, n) / 2)}, DType::kFloat16);
  Compress(spec, values.data(), residual.data(), n, packed.data());
  return packed;
}

class DistPackedPushTest : public ::testing::TestWithParam<Layout> {};

TEST_P(DistPackedPushTest, SumsAsTheStoresOwnCompressedPushesBitForBit) {
  const int n = GetParam().workers;
  for (const std::string type : {"2bit", "1bit", "fp16"}) {
    SCOPED_TRACE(type);
    InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
    job.Run([&](DistKVStore& kv) {
      const CompressionSpec spec = CompressionSpec::FromParams({{"type", type}});
      kv.SetGradientCompression({{"type", type}});
      for (size_t k = 0; k < kSizes.size(); ++k) kv.Init(static_cast<Key>(k), Array({kSizes[k]}));
      // Each key of this worker goes one way in every step (as a key's values stay on the host or
      // on a GPU): packed with this worker's own residuals where rank + key is even, else through
      // the store's compression.
      SimulatedQuantizers quantizers(spec, n, kSizes);
      std::vector<std::vector<float>> packed_residuals;
      for (int64_t size : kSizes) packed_residuals.emplace_back(size, 0.0f);
      for (int step = 0; step < 4; ++step) {
        for (size_t k = 0; k < kSizes.size(); ++k) {
          const int64_t size = kSizes[k];
          const std::vector<float> want = quantizers.Sum(step, k);
          const auto key = static_cast<Key>(k);
          const auto mine = Gradient(kv.rank(), step, size, spec.type);
          Array out({size});
          if ((kv.rank() + static_cast<int>(k)) % 2 == 0) {
            Array packed = Packed(spec, mine, packed_residuals[k]);
            if (step % 2 == 0) {
              kv.PushPacked(key, spec, packed, {out}, 0).Wait();
            } else {
              kv.PushPacked(key, spec, packed, {}, 0);
              kv.Pull(key, {out}).Wait();
            }
          } else {
            kv.PushPull(key, {Array::FromFloats(mine, {size})}, {out}).Wait();
          }
          for (int64_t i = 0; i < size; ++i) {
            ASSERT_EQ(out.floats()[i], want[i]) << "step " << step << " key " << k << " i " << i;
          }
        }
      }
    });
    job.ExpectSuccess();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistPackedPushTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 3}, Layout{3, 2}), LayoutName);

TEST(DistPackedPush, MisuseIsAClearErrorAndChangesNothing) {
  InProcessJob job("dist_sync", SmallSlots(2, 1));
  job.Run([&](DistKVStore& kv) {
    const CompressionSpec two_bit = CompressionSpec::FromParams({{"type", "2bit"}});
    kv.Init(0, Array({1001}));
    kv.Init(1, Array({1001}, DType::kFloat64));
    kv.Init(2, Array({100}));
    // The servers keep what every push adds (w -= 1 x sum): a push that got through shows.
    kv.SetOptimizer({"sgd", {{"learning_rate", 1.0}}});
    std::vector<float> residual(1001, 0.0f);
    const Array packed = Packed(two_bit, std::vector<float>(1001, 0.7f), residual);
    auto error = [&](Key key, const CompressionSpec& spec, const Array& bytes) {
      return test_support::InvalidArgumentFrom([&] { kv.PushPacked(key, spec, bytes, {}, 0); });
    };
    // Before compression is set: the store would send it uncompressed. The store stays open to
    // set_gradient_compression, as no push has happened.
    EXPECT_THAT(error(0, two_bit, packed), HasSubstr("the store compresses with none"));
    kv.SetGradientCompression({{"type", "2bit"}, {"min_elements", "1000"}});
    EXPECT_THAT(
        error(0, CompressionSpec::FromParams({{"type", "2bit"}, {"threshold", "1"}}), packed),
        HasSubstr("the store compresses with 2bit (threshold 0.5"));
    EXPECT_THAT(error(0, two_bit, Array({3})),
                HasSubstr("take 252 bytes, the packed array holds 12"));
    EXPECT_THAT(error(1, two_bit, packed), HasSubstr("float32"));
    EXPECT_THAT(error(2, two_bit, packed), HasSubstr("sends this key (100 elements) uncompressed"));
    EXPECT_THAT(error(9, two_bit, packed), HasSubstr("key 9"));
    // Nothing reached the servers and compression is still open to change (no push happened).
    kv.SetGradientCompression({{"type", "2bit"}, {"min_elements", "1000"}});
    std::vector<float> fresh(1001, 0.0f);
    Array out({1001});
    kv.PushPacked(0, two_bit, Packed(two_bit, std::vector<float>(1001, -0.7f), fresh), {out}, 0)
        .Wait();
    for (float v : out.floats()) ASSERT_EQ(v, 0.5f);  // 0 - 1 x (-0.5): only this push arrived
  });
  job.ExpectSuccess();
}

}  // namespace
}  // namespace dtrain::testing

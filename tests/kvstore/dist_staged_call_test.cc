// DistKVStore's staged calls (kvstore/staged_calls.h) through whole dist jobs in one process: a
// pushed value that arrives on the host piece by piece is sent a slot at a time, each slot only
// once its bytes have arrived; every part of a pulled value is reported once, already written,
// before the operation is done; a value that never arrives fails its operation with the reason
// instead of hanging it. This is the host side of the staging store's chunked copies to and from
// GPUs, which only a GPU can run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compression/codec.h"
#include "compression_job_support.h"
#include "dtrain/common/array.h"
#include "dtrain/common/error.h"
#include "inprocess_job.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

// Over the big-array bound (1000 elements) and 1024-byte slots: 10007 floats make 40 slots.
constexpr int64_t kSize = 10007;

std::vector<float> Ramp(int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank + 1) * 0.25f * (i % 64);
  return v;
}

// Stands in for the copy of `source` to the host: `array` holds only the bytes "arrived" so far
// (NaN elsewhere), and Await(bytes) makes the first `bytes` of them arrive, recording each count.
class ArrivingValue {
 public:
  ArrivingValue(const std::vector<char>& source, Array array)
      : source_(source), array_(std::move(array)) {
    std::vector<float> nans(array_.nbytes() / sizeof(float), std::nanf(""));
    std::memcpy(array_.bytes(), nans.data(), array_.nbytes());
  }
  std::function<void(size_t)> Hook() {
    return [this](size_t bytes) {
      awaited_.push_back(bytes);
      if (bytes > arrived_) {
        std::memcpy(array_.bytes() + arrived_, source_.data() + arrived_, bytes - arrived_);
        arrived_ = bytes;
      }
    };
  }
  const std::vector<size_t>& awaited() const { return awaited_; }
  const Array& array() const { return array_; }

 private:
  std::vector<char> source_;
  Array array_;
  size_t arrived_ = 0;
  std::vector<size_t> awaited_;
};

// A staged pushpull of key 0 whose value arrives as `value` lets it (packed with `packed` if
// given), into `out`; waited for.
void PushPullArriving(DistKVStore& kv, ArrivingValue& value, const Array& out,
                      std::optional<CompressionSpec> packed = std::nullopt) {
  StagedCall call;
  call.key = 0;
  call.values = {value.array()};
  call.packed = packed;
  call.outs = {out};
  call.await_value = value.Hook();
  kv.IssueStaged(std::move(call)).Wait();
}

std::vector<char> BytesOf(const std::vector<float>& v) {
  std::vector<char> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

// The ends (in bytes of values whose i-th element takes `bytes_of(i)`) of the key's slots.
template <typename BytesOf>
std::vector<size_t> SlotEnds(const std::vector<int64_t>& ends_in_elements, BytesOf bytes_of) {
  std::vector<size_t> out;
  for (int64_t e : ends_in_elements) out.push_back(bytes_of(e));
  return out;
}

// Where the slots of a kSize key end, in elements: every 256 floats (1024-byte slots), the bound
// splitting it over the servers first (key_partition.h), as observed through plain pushes' awaits.
std::vector<int64_t> ExpectedSlotEnds(const Config& config) {
  ps::KeyPartition partition(config.num_servers, config.bigarray_bound, config.chunk_bytes,
                             config.partition_bytes);
  std::vector<int64_t> ends;
  for (const auto& slot : partition.Add(0, kSize, DType::kFloat32)) {
    ends.push_back(slot.offset + slot.length);
  }
  return ends;
}

class DistStagedCallTest : public ::testing::TestWithParam<Layout> {};

TEST_P(DistStagedCallTest, SendsEachSlotOnceItsBytesHaveArrived) {
  const int n = GetParam().workers;
  InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
  const std::vector<int64_t> ends = ExpectedSlotEnds(job.config());
  job.Run([&](DistKVStore& kv) {
    kv.Init(0, Array({kSize}));
    for (int step = 0; step < 2; ++step) {
      const std::vector<float> mine = Ramp(kv.rank() + step, kSize);
      ArrivingValue value(BytesOf(mine), Array({kSize}));
      Array out({kSize});
      PushPullArriving(kv, value, out);
      // One wait per slot, before it was sent, each for exactly the slot's end.
      EXPECT_EQ(value.awaited(), SlotEnds(ends, [](int64_t e) { return e * sizeof(float); }));
      std::vector<float> want(kSize, 0.0f);
      for (int r = 0; r < n; ++r) {
        const std::vector<float> theirs = Ramp(r + step, kSize);
        for (int64_t i = 0; i < kSize; ++i) want[i] += theirs[i];
      }
      for (int64_t i = 0; i < kSize; ++i) {
        ASSERT_EQ(out.floats()[i], want[i]) << "step " << step << " i " << i;
      }
    }
  });
  job.ExpectSuccess();
}

TEST_P(DistStagedCallTest, SendsAPackedValueSlotBySlotToo) {
  const int n = GetParam().workers;
  InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
  const std::vector<int64_t> ends = ExpectedSlotEnds(job.config());
  job.Run([&](DistKVStore& kv) {
    const CompressionSpec spec = CompressionSpec::FromParams({{"type", "2bit"}});
    kv.SetGradientCompression({{"type", "2bit"}});
    kv.Init(0, Array({kSize}));
    // Each worker packs its gradient itself (its own residual), as a GPU would.
    SimulatedQuantizers quantizers(spec, n, {kSize});
    std::vector<float> residual(kSize, 0.0f);
    for (int step = 0; step < 2; ++step) {
      const std::vector<float> mine = Gradient(kv.rank(), step, kSize, spec.type);
      std::vector<char> packed(CompressedBytes(spec.type, kSize));
      Compress(spec, mine.data(), residual.data(), kSize, packed.data());
      ArrivingValue value(packed,
                          Array({static_cast<int64_t>(packed.size() / 2)}, DType::kFloat16));
      Array out({kSize});
      PushPullArriving(kv, value, out, spec);
      EXPECT_EQ(value.awaited(),
                SlotEnds(ends, [&](int64_t e) { return CompressedBytes(spec.type, e); }));
      const std::vector<float> want = quantizers.Sum(step, 0);
      for (int64_t i = 0; i < kSize; ++i) ASSERT_EQ(out.floats()[i], want[i]) << "i " << i;
    }
  });
  job.ExpectSuccess();
}

TEST_P(DistStagedCallTest, ReportsEveryPartOfThePulledValueOnceWrittenBeforeItIsDone) {
  const int n = GetParam().workers;
  InProcessJob job("dist_sync", SmallSlots(GetParam().servers, n));
  job.Run([&](DistKVStore& kv) {
    kv.Init(0, Array({kSize}));
    const std::vector<float> mine = Ramp(kv.rank(), kSize);
    std::vector<float> want(kSize, 0.0f);
    for (int r = 0; r < n; ++r) {
      const auto theirs = Ramp(r, kSize);
      for (int64_t i = 0; i < kSize; ++i) want[i] += theirs[i];
    }
    for (bool pushpull : {true, false}) {
      SCOPED_TRACE(pushpull ? "pushpull" : "push, then pull");
      Array out({kSize}), second({kSize});
      std::mutex mutex;
      std::vector<std::pair<size_t, size_t>> told;
      bool written = true;  // every reported byte of both outputs held its value when told
      StagedCall call;
      call.key = 0;
      call.outs = {out, second};
      call.output_ready = [&](size_t begin, size_t end) {
        std::lock_guard<std::mutex> lock(mutex);
        told.emplace_back(begin, end);
        for (size_t b = begin; b < end; b += sizeof(float)) {
          const size_t i = b / sizeof(float);
          written = written && out.floats()[i] == want[i] && second.floats()[i] == want[i];
        }
      };
      if (pushpull) {
        call.values = {Array::FromFloats(mine, {kSize})};
      } else {
        kv.Push(0, {Array::FromFloats(mine, {kSize})});
      }
      kv.IssueStaged(std::move(call)).Wait();
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_TRUE(written);
      // The parts tile the value: each byte told once.
      std::sort(told.begin(), told.end());
      size_t next = 0;
      for (auto [begin, end] : told) {
        ASSERT_EQ(begin, next);
        ASSERT_GT(end, begin);
        next = end;
      }
      EXPECT_EQ(next, kSize * sizeof(float));
      for (int64_t i = 0; i < kSize; ++i) ASSERT_EQ(second.floats()[i], want[i]) << "i " << i;
      kv.Barrier();  // the next round's pushes start once every worker has its value
    }
  });
  job.ExpectSuccess();
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistStagedCallTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 3}, Layout{3, 2}), LayoutName);

TEST(DistStagedCall, AValueThatNeverArrivesFailsItsOperationWithTheReason) {
  InProcessJob job("dist_sync", SmallSlots(1, 1));
  job.Run([&](DistKVStore& kv) {
    kv.Init(0, Array({kSize}));
    Array value = Array::FromFloats(Ramp(0, kSize), {kSize});
    StagedCall call;
    call.key = 0;
    call.values = {value};
    call.outs = {Array({kSize})};
    // The first slots arrive, then the copy fails (as a GPU's timeout would).
    call.await_value = [](size_t bytes) {
      if (bytes > 4096) throw TimeoutError("the copy to the host did not finish");
    };
    Operation op = kv.IssueStaged(std::move(call));
    try {
      op.Wait();
      ADD_FAILURE() << "the operation succeeded";
    } catch (const TimeoutError& e) {
      EXPECT_THAT(e.what(), HasSubstr("the copy to the host did not finish"));
    }
  });
  job.ExpectSuccess();
}

TEST(DistStagedCall, AnOutputHookThatThrowsFailsTheOperationNotTheNetworkThread) {
  InProcessJob job("dist_sync", SmallSlots(2, 1));
  job.Run([&](DistKVStore& kv) {
    kv.Init(0, Array({kSize}));
    kv.Push(0, {Array::FromFloats(Ramp(0, kSize), {kSize})});
    StagedCall call;
    call.key = 0;
    call.outs = {Array({kSize})};
    call.output_ready = [](size_t begin, size_t) {
      if (begin > 0) throw Error("the copy to the GPU could not start");
    };
    try {
      kv.IssueStaged(std::move(call)).Wait();
      ADD_FAILURE() << "the operation succeeded";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("the copy to the GPU could not start"));
    }
    // The store goes on: the next pull gets the value.
    Array out({kSize});
    kv.Pull(0, {out}).Wait();
    EXPECT_EQ(out.floats()[kSize - 1], Ramp(0, kSize)[kSize - 1]);
  });
  job.ExpectSuccess();
}

TEST(DistStagedCall, AStagedPullOrPushOfMisfitArraysIsRefusedAtTheCall) {
  InProcessJob job("dist_sync", SmallSlots(1, 1));
  job.Run([&](DistKVStore& kv) {
    kv.Init(0, Array({kSize}));
    StagedCall pull;
    pull.key = 0;
    pull.outs = {Array({7})};
    EXPECT_THROW(kv.IssueStaged(pull), InvalidArgument);
    StagedCall two_packed;
    two_packed.key = 0;
    two_packed.values = {Array({3}), Array({3})};
    two_packed.packed = CompressionSpec::FromParams({{"type", "2bit"}});
    EXPECT_THROW(kv.IssueStaged(two_packed), InvalidArgument);
  });
  job.ExpectSuccess();
}

// With servers that can be replaced, each push is copied into the push log first: the whole value
// is awaited once, before anything is sent.
TEST(DistStagedCall, WithAPushLogTheValueIsAwaitedWholeFirst) {
  std::string dir = (std::filesystem::temp_directory_path() / "dtrain-staged-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  Config config = SmallSlots(2, 1);
  config.checkpoint_dir = dir;
  config.restart_wait = std::chrono::milliseconds(5000);
  ASSERT_TRUE(config.ServersReplaceable());
  InProcessJob job("dist_sync", config);
  job.Run([&](DistKVStore& kv) {
    kv.Init(0, Array({kSize}));
    ArrivingValue value(BytesOf(Ramp(0, kSize)), Array({kSize}));
    Array out({kSize});
    PushPullArriving(kv, value, out);
    EXPECT_EQ(value.awaited(), std::vector<size_t>{kSize * sizeof(float)});
    EXPECT_EQ(out.floats()[kSize - 1], Ramp(0, kSize)[kSize - 1]);
  });
  job.ExpectSuccess();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::testing

// Row-sparse pushes and pulls through a whole in-process job (DistKVStore::PushRows, PullRows;
// server_rows.cc): a matrix spread over several slots and servers, workers whose rows differ and
// overlap, against MXNet's lazy formulas (lazy_update 1) and the dense ones (lazy_update 0)
// written out here; without an optimizer, dist_async, a round mixing dense and row pushes, and
// refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "dtrain/common/array.h"
#include "dtrain/common/error.h"
#include "inprocess_job.h"
#include "optim/optimizer.h"

namespace dtrain::testing {
namespace {

constexpr int64_t kRows = 40;
constexpr int64_t kRowLength = 8;  // 32-byte rows; slots of 256 bytes hold 8 rows
constexpr Key kTable = 5;
constexpr int kSteps = 3;
const double kLr = 0.1, kMomentum = 0.9, kWd = 0.01;

Config SmallSlots(int servers, int workers) {
  Config c = InMemoryJobConfig(servers, workers);
  c.bigarray_bound = 64;  // the table is split over every server
  c.chunk_bytes = 256;
  return c;
}

double Initial(int64_t row, int64_t e) { return 1.0 + 0.01 * static_cast<double>(row * 3 + e); }

// Worker `rank`'s rows at `step`: they differ between workers and overlap; one repeats a row.
std::vector<int64_t> RowsOf(int rank, int step) {
  std::vector<int64_t> rows;
  for (int64_t r = (rank * 7 + step * 5) % kRows, n = 0; n < 6; ++n) {
    rows.push_back((r + n * (rank + 2)) % kRows);
  }
  if (rank == 0) rows.push_back(rows.front());  // a repeat: summed
  return rows;
}

float GradOf(int rank, int step, size_t i, int64_t e) {
  return static_cast<float>(0.5 * (rank + 1) - 0.1 * step + 0.01 * static_cast<double>(i + e));
}

Array RowsGrad(int rank, int step) {
  const std::vector<int64_t> rows = RowsOf(rank, step);
  Array g({static_cast<int64_t>(rows.size()), kRowLength});
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t e = 0; e < kRowLength; ++e) {
      g.floats()[i * kRowLength + static_cast<size_t>(e)] = GradOf(rank, step, i, e);
    }
  }
  return g;
}

Array Table() {
  Array t({kRows, kRowLength});
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t e = 0; e < kRowLength; ++e) {
      t.floats()[static_cast<size_t>(r * kRowLength + e)] = static_cast<float>(Initial(r, e));
    }
  }
  return t;
}

std::vector<int64_t> AllRows() {
  std::vector<int64_t> rows(kRows);
  for (int64_t r = 0; r < kRows; ++r) rows[static_cast<size_t>(r)] = kRows - 1 - r;  // reversed
  return rows;
}

// The table after `steps` steps of SGD with momentum and weight decay on the servers, written out
// from MXNet's formulas: lazy, only the rows some worker pushed move; dense, every row does, with
// a zero gradient where nobody pushed.
std::vector<double> Expected(int workers, int steps, bool lazy) {
  std::vector<double> w(kRows * kRowLength), mom(w.size(), 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t e = 0; e < kRowLength; ++e)
      w[static_cast<size_t>(r * kRowLength + e)] = Initial(r, e);
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<double> grad(w.size(), 0.0);
    std::vector<bool> touched(kRows, false);
    for (int rank = 0; rank < workers; ++rank) {
      const std::vector<int64_t> rows = RowsOf(rank, step);
      for (size_t i = 0; i < rows.size(); ++i) {
        touched[static_cast<size_t>(rows[i])] = true;
        for (int64_t e = 0; e < kRowLength; ++e) {
          grad[static_cast<size_t>(rows[i] * kRowLength + e)] += GradOf(rank, step, i, e);
        }
      }
    }
    for (size_t j = 0; j < w.size(); ++j) {
      if (lazy && !touched[j / kRowLength]) continue;
      mom[j] = kMomentum * mom[j] - kLr * kWd * w[j] - kLr * grad[j];
      w[j] += mom[j];
    }
  }
  return w;
}

// Pulls every row (in reverse order) and compares with `want`, row by row.
void ExpectTable(DistKVStore& kv, const std::vector<double>& want, const std::string& when) {
  const std::vector<int64_t> rows = AllRows();
  Array out({kRows, kRowLength});
  kv.PullRows(kTable, rows, out).Wait();
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t e = 0; e < kRowLength; ++e) {
      const double expected = want[static_cast<size_t>(rows[i] * kRowLength + e)];
      ASSERT_NEAR(out.floats()[i * kRowLength + static_cast<size_t>(e)], expected,
                  1e-5 * std::max(1.0, std::fabs(expected)))
          << when << ", row " << rows[i] << " element " << e << " (worker " << kv.rank() << ")";
    }
  }
}

struct Layout {
  int servers, workers;
};

class RowsOnServersTest : public ::testing::TestWithParam<Layout> {};

void TrainRows(const Layout& c, bool lazy) {
  InProcessJob job("dist_sync", SmallSlots(c.servers, c.workers));
  job.Run([&](DistKVStore& kv) {
    kv.Init(kTable, Table());
    kv.SetOptimizer({"sgd",
                     {{"learning_rate", kLr},
                      {"momentum", kMomentum},
                      {"wd", kWd},
                      {"lazy_update", lazy ? 1.0 : 0.0}}});
    for (int step = 0; step < kSteps; ++step) {
      kv.PushRows(kTable, RowsOf(kv.rank(), step), RowsGrad(kv.rank(), step));
      ExpectTable(kv, Expected(c.workers, step + 1, lazy), "step " + std::to_string(step));
    }
  });
  job.ExpectSuccess();
}

TEST_P(RowsOnServersTest, LazyUpdatesAreMxnetsLazyFormula) { TrainRows(GetParam(), true); }

TEST_P(RowsOnServersTest, LazyUpdateOffIsTheDenseFormula) { TrainRows(GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(Layouts, RowsOnServersTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 2}, Layout{2, 3}),
                         [](const auto& info) {
                           return std::to_string(info.param.servers) + "x" +
                                  std::to_string(info.param.workers);
                         });

// Without an optimizer a round's sum becomes the value: the rows pushed, summed over workers,
// and zeros elsewhere (as a dense push of the same gradients gives).
TEST(RowsWithoutAnOptimizer, TheValueIsTheRoundsSum) {
  InProcessJob job("dist_sync", SmallSlots(2, 2));
  job.Run([&](DistKVStore& kv) {
    kv.Init(kTable, Table());
    for (int step = 0; step < 2; ++step) {
      kv.PushRows(kTable, RowsOf(kv.rank(), step), RowsGrad(kv.rank(), step));
      std::vector<double> want(kRows * kRowLength, 0.0);
      for (int rank = 0; rank < 2; ++rank) {
        const std::vector<int64_t> rows = RowsOf(rank, step);
        for (size_t i = 0; i < rows.size(); ++i) {
          for (int64_t e = 0; e < kRowLength; ++e) {
            want[static_cast<size_t>(rows[i] * kRowLength + e)] += GradOf(rank, step, i, e);
          }
        }
      }
      ExpectTable(kv, want, "step " + std::to_string(step));
    }
  });
  job.ExpectSuccess();
}

// dist_async: each push is applied on arrival, lazily.
TEST(RowsAsync, EachPushIsALazyUpdate) {
  InProcessJob job("dist_async", SmallSlots(2, 1));
  job.Run([&](DistKVStore& kv) {
    kv.Init(kTable, Table());
    kv.SetOptimizer({"sgd", {{"learning_rate", kLr}, {"momentum", kMomentum}, {"wd", kWd}}});
    for (int step = 0; step < kSteps; ++step) {
      kv.PushRows(kTable, RowsOf(0, step), RowsGrad(0, step)).Wait();
      ExpectTable(kv, Expected(1, step + 1, true), "push " + std::to_string(step));
    }
  });
  job.ExpectSuccess();
}

// A round where one worker pushes the dense gradient and the other rows: summed densely.
TEST(RowsMixedWithDense, ARoundSumsBoth) {
  InProcessJob job("dist_sync", SmallSlots(2, 2));
  job.Run([&](DistKVStore& kv) {
    kv.Init(kTable, Table());
    Array dense({kRows, kRowLength});
    dense.Fill(1.f);
    if (kv.rank() == 0) {
      kv.Push(kTable, {dense});
    } else {
      kv.PushRows(kTable, {3, 3, 17},
                  Array::FromFloats(std::vector<float>(3 * kRowLength, 2.f), {3, kRowLength}));
    }
    std::vector<double> want(kRows * kRowLength, 1.0);
    for (int64_t e = 0; e < kRowLength; ++e) {
      want[static_cast<size_t>(3 * kRowLength + e)] = 5.0;
      want[static_cast<size_t>(17 * kRowLength + e)] = 3.0;
    }
    ExpectTable(kv, want, "the mixed round");
  });
  job.ExpectSuccess();
}

// Compressed row pushes: each worker's rows (repeats summed) pass through the codec as the dense
// path's values do, error feedback per element included; the servers sum what they decode.
class CompressedRowsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CompressedRowsTest, TheRoundsSumIsTheCodecsOfEachWorkersRows) {
  std::map<std::string, std::string> params = {{"type", GetParam()}};
  if (std::string(GetParam()) == "2bit") params["threshold"] = "0.5";
  const CompressionSpec spec = CompressionSpec::FromParams(params);
  InProcessJob job("dist_sync", SmallSlots(2, 2));
  job.Run([&](DistKVStore& kv) {
    kv.Init(kTable, Table());
    kv.SetGradientCompression(params);
    std::vector<std::vector<float>> residual(2, std::vector<float>(kRows * kRowLength, 0.f));
    for (int step = 0; step < 3; ++step) {
      kv.PushRows(kTable, RowsOf(kv.rank(), step), RowsGrad(kv.rank(), step));
      std::vector<double> want(kRows * kRowLength, 0.0);
      for (int rank = 0; rank < 2; ++rank) {
        // The worker's rows summed, then each element through the codec with its residual.
        std::vector<float> dense(kRows * kRowLength, 0.f);
        std::vector<bool> pushed(kRows, false);
        const std::vector<int64_t> rows = RowsOf(rank, step);
        for (size_t i = 0; i < rows.size(); ++i) {
          pushed[static_cast<size_t>(rows[i])] = true;
          for (int64_t e = 0; e < kRowLength; ++e) {
            dense[static_cast<size_t>(rows[i] * kRowLength + e)] += GradOf(rank, step, i, e);
          }
        }
        for (int64_t r = 0; r < kRows; ++r) {
          if (!pushed[static_cast<size_t>(r)]) continue;
          float* row = dense.data() + r * kRowLength;
          std::vector<char> packed(CompressedBytes(spec.type, kRowLength));
          Compress(spec, row, residual[rank].data() + r * kRowLength, kRowLength, packed.data());
          std::vector<float> back(kRowLength);
          Decompress(spec, packed.data(), kRowLength, back.data(), false);
          for (int64_t e = 0; e < kRowLength; ++e)
            want[static_cast<size_t>(r * kRowLength + e)] += back[e];
        }
      }
      ExpectTable(kv, want, std::string(GetParam()) + " step " + std::to_string(step));
    }
  });
  job.ExpectSuccess();
}

INSTANTIATE_TEST_SUITE_P(Codecs, CompressedRowsTest, ::testing::Values("fp16", "2bit"),
                         [](const auto& info) {
                           return std::string(info.param) == "fp16" ? "fp16" : "twobit";
                         });

TEST(RowsRefused, BadRequestsNameTheProblem) {
  InProcessJob job("dist_sync", SmallSlots(2, 1));
  job.Run([&](DistKVStore& kv) {
    kv.Init(kTable, Table());
    kv.Init(6, Array({16}));
    auto error = [&](auto&& call) {
      try {
        call();
      } catch (const InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string("(no error)");
    };
    const Array one_row({1, kRowLength});
    EXPECT_THAT(error([&] { kv.PushRows(6, {0}, Array({1})); }),
                ::testing::HasSubstr("of shape (16,) is not a matrix"));
    EXPECT_THAT(error([&] { kv.PushRows(kTable, {40}, one_row); }),
                ::testing::HasSubstr("row 40 (at 0) is outside its 40 rows"));
    EXPECT_THAT(error([&] { kv.PullRows(kTable, {-1}, one_row); }),
                ::testing::HasSubstr("row -1 (at 0) is outside"));
    EXPECT_THAT(error([&] {
                  kv.PushRows(kTable, {1, 2}, one_row);
                }),
                ::testing::HasSubstr("2 rows of 8 float32 need as many values; got 8 float32"));
    EXPECT_THAT(error([&] { kv.PullRows(9, {1}, one_row); }),
                ::testing::HasSubstr("never initialised"));
  });
  job.ExpectSuccess();
}

}  // namespace
}  // namespace dtrain::testing

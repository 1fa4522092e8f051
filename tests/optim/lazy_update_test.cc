// Optimizer::UpdateRows, MXNet's lazy update of a row-sparse gradient: against MXNet's lazy
// formulas written out here in double (SGD with momentum and weight decay, Adam, AdaGrad) over
// steps whose row sets differ and overlap; untouched rows and their state unchanged; the state
// shared with dense updates; refusals that change nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "optim/optim_test_util.h"

namespace dtrain {
namespace {

using optim_test::ExpectNear;
using optim_test::InvalidArgumentFrom;
using optim_test::RandomVector;

constexpr size_t kRowLength = 4;
constexpr size_t kRows = 6;

// Each step's rows (increasing) and their gradients: overlapping sets, one step touching none.
struct SparseStep {
  std::vector<int64_t> rows;
  std::vector<float> grad;  // rows.size() * kRowLength
};

std::vector<SparseStep> Steps() {
  std::mt19937 rng(11);
  std::vector<SparseStep> steps;
  for (const std::vector<int64_t>& rows :
       std::vector<std::vector<int64_t>>{{0, 2, 5}, {2, 3}, {}, {0, 1, 2, 3, 4, 5}, {5}, {1, 2}}) {
    steps.push_back({rows, RandomVector(rng, rows.size() * kRowLength)});
  }
  return steps;
}

// The dense references below, applied to one row: `w`, `s1` and `s2` point at its elements.
using RowRule = std::function<void(uint64_t t, double* w, double* s1, double* s2, const float* g)>;

// MXNet's lazy update: the rule runs on the rows of the step's gradient only; t counts the
// key's updates (Adam's bias correction uses it), touched or not.
std::vector<double> Reference(const std::vector<float>& initial, const RowRule& rule) {
  std::vector<double> w(initial.begin(), initial.end()), s1(w.size()), s2(w.size());
  uint64_t t = 0;
  for (const SparseStep& step : Steps()) {
    ++t;
    for (size_t i = 0; i < step.rows.size(); ++i) {
      const size_t first = static_cast<size_t>(step.rows[i]) * kRowLength;
      for (size_t e = 0; e < kRowLength; ++e) {
        rule(t, &w[first + e], &s1[first + e], &s2[first + e], &step.grad[i * kRowLength + e]);
      }
    }
  }
  return w;
}

std::vector<float> Lazy(Optimizer& opt, std::vector<float> w) {
  for (const SparseStep& step : Steps()) opt.UpdateRows(7, w, kRowLength, step.rows, step.grad);
  return w;
}

std::vector<float> Initial() {
  std::mt19937 rng(5);
  return RandomVector(rng, kRows * kRowLength);
}

TEST(LazyUpdateTest, SgdWithMomentumAndWeightDecayIsMxnetsLazyFormula) {
  const double lr = 0.1, momentum = 0.9, wd = 0.01, rescale = 0.5;
  auto opt = CreateOptimizer(
      {"sgd",
       {{"learning_rate", lr}, {"momentum", momentum}, {"wd", wd}, {"rescale_grad", rescale}}});
  const auto want =
      Reference(Initial(), [&](uint64_t, double* w, double* mom, double*, const float* g) {
        *mom = momentum * *mom - lr * wd * *w - lr * rescale * *g;
        *w += *mom;
      });
  ExpectNear(Lazy(*opt, Initial()), want, 1e-5);
}

TEST(LazyUpdateTest, AdamIsMxnetsLazyFormulaWithTheKeysUpdateCount) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  auto opt = CreateOptimizer(
      {"adam",
       {{"learning_rate", lr}, {"beta1", b1}, {"beta2", b2}, {"epsilon", eps}, {"wd", wd}}});
  const auto want =
      Reference(Initial(), [&](uint64_t t, double* w, double* m, double* v, const float* grad) {
        const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
        const double g = *grad + wd * *w;
        *m = b1 * *m + (1 - b1) * g;
        *v = b2 * *v + (1 - b2) * g * g;
        *w -= lr_t * *m / (std::sqrt(*v) + eps);
      });
  ExpectNear(Lazy(*opt, Initial()), want, 1e-5);
}

TEST(LazyUpdateTest, AdagradIsMxnetsLazyFormula) {
  const double lr = 0.1, eps = 1e-7, wd = 0.01;
  auto opt = CreateOptimizer({"adagrad", {{"learning_rate", lr}, {"eps", eps}, {"wd", wd}}});
  const auto want =
      Reference(Initial(), [&](uint64_t, double* w, double* history, double*, const float* grad) {
        const double g = *grad;
        *history += g * g;
        *w -= (g / std::sqrt(*history + eps) + wd * *w) * lr;
      });
  ExpectNear(Lazy(*opt, Initial()), want, 1e-5);
}

// The rows a lazy update touches change as a dense update of them would (the same kernel, the same
// state); the other rows, their weights and state, do not change at all.
TEST(LazyUpdateTest, TouchedRowsMoveAsDenseOnesAndTheOthersNotAtAll) {
  const OptimizerSpec spec{"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.1}}};
  auto lazy = CreateOptimizer(spec);
  auto dense = CreateOptimizer(spec);
  std::vector<float> w = Initial(), dense_w = Initial();
  std::vector<float> full(w.size(), 1.f);
  lazy->Update(0, w, full);  // momentum in every row
  dense->Update(0, dense_w, full);
  const std::vector<float> before = w;
  const std::vector<float> row_grad(kRowLength, 0.5f);
  lazy->UpdateRows(0, w, kRowLength, std::vector<int64_t>{2}, row_grad);
  std::vector<float> dense_grad(w.size(), 0.f);
  std::copy(row_grad.begin(), row_grad.end(), dense_grad.begin() + 2 * kRowLength);
  dense->Update(0, dense_w, dense_grad);
  for (size_t e = 0; e < w.size(); ++e) {
    if (e / kRowLength == 2) {
      EXPECT_EQ(w[e], dense_w[e]) << e;
    } else {
      EXPECT_EQ(w[e], before[e]) << e;        // no decay, no momentum: untouched
      EXPECT_NE(dense_w[e], before[e]) << e;  // the dense update moved it
    }
  }
  EXPECT_EQ(lazy->UpdateCount(0), 2u);
  // The next dense update finds rows 0, 1, 3.. with the momentum of the first step only.
  lazy->Update(0, w, full);
  auto replay = CreateOptimizer(spec);
  std::vector<float> again = Initial();
  replay->Update(0, again, full);
  replay->Update(0, again, full);
  EXPECT_EQ(w[0], again[0]);
}

TEST(LazyUpdateTest, BadRowsAreRefusedAndChangeNothing) {
  auto opt = CreateOptimizer({"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}});
  std::vector<float> w = Initial();
  const std::vector<float> initial = w;
  const std::vector<float> two_rows(2 * kRowLength, 1.f);
  auto refused = [&](size_t row_length, std::vector<int64_t> rows, std::vector<float> grad) {
    return InvalidArgumentFrom([&] { opt->UpdateRows(1, w, row_length, rows, grad); });
  };
  EXPECT_THAT(refused(kRowLength, {1, 1}, two_rows), ::testing::HasSubstr("rows must increase"));
  EXPECT_THAT(refused(kRowLength, {3, 1}, two_rows), ::testing::HasSubstr("rows must increase"));
  EXPECT_THAT(refused(kRowLength, {1, 6}, two_rows),
              ::testing::HasSubstr("outside the weight's 6 rows"));
  EXPECT_THAT(refused(kRowLength, {-1, 2}, two_rows), ::testing::HasSubstr("outside"));
  EXPECT_THAT(refused(kRowLength, {1}, two_rows),
              ::testing::HasSubstr("a gradient of 8 elements for 1 rows of 4"));
  EXPECT_THAT(refused(5, {1}, two_rows), ::testing::HasSubstr("do not divide a weight of 24"));
  EXPECT_THAT(refused(0, {1}, two_rows), ::testing::HasSubstr("rows of 0 elements"));
  EXPECT_EQ(w, initial);
  EXPECT_EQ(opt->UpdateCount(1), 0u);
}

}  // namespace
}  // namespace dtrain

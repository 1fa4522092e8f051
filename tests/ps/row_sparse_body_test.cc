// The row-sparse push and row request bodies (ps/row_sparse_body.h): round trips in any order
// with repeats, and every malformed body refused with a ProtocolError that says why.
#include "ps/row_sparse_body.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain::ps {
namespace {

using ::testing::HasSubstr;

std::string Push(const std::vector<int64_t>& rows, const std::vector<float>& values,
                 size_t row_length) {
  std::string body(RowSparseBytes(rows.size(), row_length * sizeof(float)), '\0');
  EncodeRowSparse(rows, values.data(), row_length * sizeof(float), body.data());
  return body;
}

std::string ErrorOf(const std::string& body, int64_t slot_rows, size_t row_bytes) {
  try {
    DecodeRowSparse(body.data(), body.size(), slot_rows, row_bytes);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "(decoded)";
}

TEST(RowSparseBody, APushRoundTripsInItsOrderWithRepeats) {
  const std::vector<int64_t> rows{5, 0, 5, 2};
  const std::vector<float> values{1, 2, 3, 4, 5, 6, 7, 8};  // rows of 2
  const std::string body = Push(rows, values, 2);
  EXPECT_EQ(body.size(), 8 + 4 * 8 + 8 * 4u);
  const RowSparseView view = DecodeRowSparse(body.data(), body.size(), 6, 2 * sizeof(float));
  EXPECT_EQ(view.rows, rows);
  std::vector<float> back(values.size());
  std::memcpy(back.data(), view.values, back.size() * sizeof(float));
  EXPECT_EQ(back, values);
  float third[2];
  std::memcpy(third, view.row(2), sizeof(third));
  EXPECT_EQ(third[0], 5.f);
}

TEST(RowSparseBody, AnEmptyPushIsJustItsCount) {
  const std::string body = Push({}, {}, 4);
  EXPECT_EQ(body.size(), 8u);
  EXPECT_TRUE(DecodeRowSparse(body.data(), body.size(), 3, 16).rows.empty());
}

TEST(RowSparseBody, MalformedPushesAreRefusedNamingWhy) {
  const std::string body = Push({1, 2}, {1, 2, 3, 4}, 2);
  EXPECT_THAT(ErrorOf(body, 2, 8), HasSubstr("row id 2 at 1 is outside the slot's 2 rows"));
  EXPECT_THAT(ErrorOf(body.substr(0, body.size() - 1), 3, 8),
              HasSubstr("announces 2 rows of 16 bytes (with their ids) but carries 31 bytes"));
  EXPECT_THAT(ErrorOf(body + "x", 3, 8), HasSubstr("carries 33 bytes"));
  EXPECT_THAT(ErrorOf(body, 3, 4), HasSubstr("announces 2 rows of 12 bytes"));
  EXPECT_THAT(ErrorOf("abc", 3, 8), HasSubstr("shorter than its row count"));
  EXPECT_THAT(ErrorOf(body, 3, 0), HasSubstr("rows of 0 bytes"));
  // A count so large that n * entry overflows is refused, not wrapped.
  std::string huge(8, '\xff');
  EXPECT_THAT(ErrorOf(huge + std::string(16, '\0'), 3, 8), HasSubstr("announces"));
  // A negative id.
  std::string negative = Push({-1}, {1, 2}, 2);
  EXPECT_THAT(ErrorOf(negative, 3, 8), HasSubstr("row id -1 at 0 is outside"));
}

TEST(RowSparseBody, ARequestCarriesIdsOnly) {
  const std::vector<int64_t> rows{3, 1, 3};
  std::string body(RowSparseBytes(rows.size(), 0), '\0');
  EncodeRowSparse(rows, nullptr, 0, body.data());
  EXPECT_EQ(DecodeRowRequest(body.data(), body.size(), 4), rows);
  try {
    DecodeRowRequest(body.data(), body.size(), 3);
    FAIL() << "row 3 of 3 decoded";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("a row request: row id 3 at 0 is outside the slot's 3 rows"));
  }
  EXPECT_THROW(RowSparseBytes(size_t{1} << 62, 64), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::ps

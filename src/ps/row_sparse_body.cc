#include "ps/row_sparse_body.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "common/elementwise.h"
#include "dtrain/common/error.h"

namespace dtrain::ps {
namespace {

constexpr size_t kCountBytes = sizeof(uint64_t);
constexpr size_t kIdBytes = sizeof(int64_t);

void PutU64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
}

uint64_t GetU64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

// The ids that follow the count, each checked against the slot's rows.
std::vector<int64_t> ReadIds(const char* data, uint64_t n, int64_t slot_rows, const char* what) {
  std::vector<int64_t> rows(n);
  for (uint64_t i = 0; i < n; ++i) {
    const auto id = static_cast<int64_t>(GetU64(data + kCountBytes + i * kIdBytes));
    if (id < 0 || id >= slot_rows) {
      throw ProtocolError(std::string(what) + ": row id " + std::to_string(id) + " at " +
                          std::to_string(i) + " is outside the slot's " +
                          std::to_string(slot_rows) + " rows");
    }
    rows[i] = id;
  }
  return rows;
}

// n, read from the body and checked against its size: exactly n entries of entry_bytes follow.
uint64_t ReadCount(const char* data, size_t size, size_t entry_bytes, const char* what) {
  if (size < kCountBytes) {
    throw ProtocolError(std::string(what) + " of " + std::to_string(size) +
                        " bytes is shorter than its row count");
  }
  const uint64_t n = GetU64(data);
  const size_t rest = size - kCountBytes;
  if (n > rest / entry_bytes || n * entry_bytes != rest) {
    throw ProtocolError(std::string(what) + " announces " + std::to_string(n) + " rows of " +
                        std::to_string(entry_bytes) + " bytes (with their ids) but carries " +
                        std::to_string(rest) + " bytes after the count");
  }
  return n;
}

}  // namespace

size_t RowSparseBytes(size_t n, size_t row_bytes) {
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  if (row_bytes > kMax - kIdBytes || (n > 0 && n > (kMax - kCountBytes) / (kIdBytes + row_bytes))) {
    throw InvalidArgument("a row-sparse body of " + std::to_string(n) + " rows of " +
                          std::to_string(row_bytes) + " bytes is too large to address");
  }
  return kCountBytes + n * (kIdBytes + row_bytes);
}

void EncodeRowSparse(std::span<const int64_t> rows, const void* values, size_t row_bytes,
                     char* out) {
  PutU64(rows.size(), out);
  for (size_t i = 0; i < rows.size(); ++i) {
    PutU64(static_cast<uint64_t>(rows[i]), out + kCountBytes + i * kIdBytes);
  }
  if (row_bytes > 0 && !rows.empty()) {
    std::memcpy(out + kCountBytes + rows.size() * kIdBytes, values, rows.size() * row_bytes);
  }
}

RowSparseView DecodeRowSparse(const char* data, size_t size, int64_t slot_rows, size_t row_bytes) {
  if (row_bytes == 0) throw ProtocolError("a row-sparse push into a slot of rows of 0 bytes");
  const uint64_t n = ReadCount(data, size, kIdBytes + row_bytes, "a row-sparse push");
  RowSparseView view;
  view.rows = ReadIds(data, n, slot_rows, "a row-sparse push");
  view.values = data + kCountBytes + n * kIdBytes;
  view.row_bytes = row_bytes;
  view.values_bytes = n * row_bytes;
  return view;
}

RowSparseView DecodeRowSparseIds(const char* data, size_t size, int64_t slot_rows) {
  if (size < kCountBytes) {
    throw ProtocolError("a packed row push of " + std::to_string(size) +
                        " bytes is shorter than its row count");
  }
  const uint64_t n = GetU64(data);
  if (n > (size - kCountBytes) / kIdBytes) {
    throw ProtocolError("a packed row push announces " + std::to_string(n) + " rows but carries " +
                        std::to_string(size - kCountBytes) + " bytes after the count");
  }
  RowSparseView view;
  view.rows = ReadIds(data, n, slot_rows, "a packed row push");
  view.values = data + kCountBytes + n * kIdBytes;
  view.values_bytes = size - kCountBytes - n * kIdBytes;
  return view;
}

std::vector<int64_t> DecodeRowRequest(const char* data, size_t size, int64_t slot_rows) {
  const uint64_t n = ReadCount(data, size, kIdBytes, "a row request");
  return ReadIds(data, n, slot_rows, "a row request");
}

std::vector<size_t> SortedRowOrder(std::span<const int64_t> rows) {
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a] < rows[b]; });
  return order;
}

CoalescedRows CoalesceRows(std::span<const int64_t> rows, const char* values, size_t row_bytes,
                           int64_t row_length, DType dtype) {
  CoalescedRows out;
  out.values.reserve(rows.size() * row_bytes);
  for (size_t i : SortedRowOrder(rows)) {
    const char* row = values + i * row_bytes;
    if (!out.rows.empty() && out.rows.back() == rows[i]) {
      AddInto(out.values.data() + out.values.size() - row_bytes, row, row_length, dtype);
    } else {
      out.rows.push_back(rows[i]);
      out.values.insert(out.values.end(), row, row + row_bytes);
    }
  }
  return out;
}

}  // namespace dtrain::ps

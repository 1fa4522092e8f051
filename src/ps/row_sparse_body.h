// The body of a row-sparse push and of a row request (MXNet's row_sparse storage on the wire):
// what a worker sends a server for the rows of one slot of an embedding-like key, a matrix cut
// into slots at row boundaries (KeyPartition), so that every server holds whole rows.
//
//   rows push:     u64 n, then n row ids (i64), then n rows of row_bytes each, in the ids' order
//                  (or, compressed, the n rows' float32 values packed as compression/codec.h does)
//   rows request:  u64 n, then n row ids (i64); the answer is the n rows, in the request's order
//
// Integers are little-endian; row ids count from the slot's first row. Ids may come in any order
// and repeat: a server adds a pushed row to the slot's sum for each time its id appears (the
// duplicates of an embedding's gradient are summed, as torch's coalesce would). The decoders read
// untrusted bytes: the length must be exactly what n announces, and every id must lie within the
// slot; anything else is a ProtocolError naming what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/common/dtype.h"

namespace dtrain::ps {

struct RowSparseView {
  std::vector<int64_t> rows;     // as sent: any order, repeats allowed
  const char* values = nullptr;  // rows.size() rows of row_bytes, in the same order
  size_t row_bytes = 0;
  size_t values_bytes = 0;  // bytes from `values` to the body's end

  const char* row(size_t i) const { return values + i * row_bytes; }
};

// Bytes of a push of n rows of row_bytes; a request's are RowSparseBytes(n, 0). Throws
// InvalidArgument when that overflows size_t.
size_t RowSparseBytes(size_t n, size_t row_bytes);

// Writes a push (or, with row_bytes 0 and values null, a request) into out, which holds
// RowSparseBytes(rows.size(), row_bytes) bytes. `values`: the rows, one after another.
void EncodeRowSparse(std::span<const int64_t> rows, const void* values, size_t row_bytes,
                     char* out);

// A push into a slot of `slot_rows` rows of `row_bytes` (> 0). `values` points into `data`.
RowSparseView DecodeRowSparse(const char* data, size_t size, int64_t slot_rows, size_t row_bytes);

// A push whose rows are packed (compressed): its ids, and `values` at the packed rows, which are
// the rest of the body (values_bytes; the caller checks them against the compression's size for
// rows.size() rows). row_bytes is 0.
RowSparseView DecodeRowSparseIds(const char* data, size_t size, int64_t slot_rows);

// A request's row ids, for a slot of `slot_rows` rows.
std::vector<int64_t> DecodeRowRequest(const char* data, size_t size, int64_t slot_rows);

// The order that sorts `rows` (stable: repeats keep theirs).
std::vector<size_t> SortedRowOrder(std::span<const int64_t> rows);

// Rows each once, in increasing order, with the values of repeated ones summed: what a worker
// sends a server (so that a server gets each row at most once) and what Optimizer::UpdateRows
// takes.
struct CoalescedRows {
  std::vector<int64_t> rows;
  std::vector<char> values;  // rows.size() rows of row_bytes
};

// `values`: rows.size() rows of `row_length` elements of `dtype` (row_bytes each).
CoalescedRows CoalesceRows(std::span<const int64_t> rows, const char* values, size_t row_bytes,
                           int64_t row_length, DType dtype);

}  // namespace dtrain::ps

// libFuzzer target for the row-sparse push and row request decoders (ps/row_sparse_body.h), which
// a server runs on bodies from the network. The first two bytes pick the slot's rows and the row
// size; the rest is the body. Whatever the input, each decoder must return or throw
// ProtocolError: no crash, no memory error, no other exception. A push or request that decodes
// must encode back to the same bytes, and its ids must lie within the slot.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dtrain/common/error.h"
#include "ps/row_sparse_body.h"

namespace {

using namespace dtrain::ps;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_row_sparse_decoder: %s\n", what);
  std::abort();
}

void CheckIds(const std::vector<int64_t>& rows, int64_t slot_rows) {
  for (int64_t id : rows) {
    if (id < 0 || id >= slot_rows) Fail("an id outside the slot decoded");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t slot_rows = data[0];
  const size_t row_bytes = data[1] % 33;
  const char* body = reinterpret_cast<const char*>(data + 2);
  const size_t body_size = size - 2;
  try {
    const RowSparseView view = DecodeRowSparse(body, body_size, slot_rows, row_bytes);
    CheckIds(view.rows, slot_rows);
    std::string again(RowSparseBytes(view.rows.size(), row_bytes), '\0');
    EncodeRowSparse(view.rows, view.values, row_bytes, again.data());
    if (again.size() != body_size || std::memcmp(again.data(), body, body_size) != 0) {
      Fail("a decoded push did not encode back to its bytes");
    }
  } catch (const dtrain::ProtocolError&) {
  }
  try {
    const RowSparseView view = DecodeRowSparseIds(body, body_size, slot_rows);
    CheckIds(view.rows, slot_rows);
    if (view.values + view.values_bytes != body + body_size) Fail("packed rows past the body");
  } catch (const dtrain::ProtocolError&) {
  }
  try {
    const std::vector<int64_t> rows = DecodeRowRequest(body, body_size, slot_rows);
    CheckIds(rows, slot_rows);
    std::string again(RowSparseBytes(rows.size(), 0), '\0');
    EncodeRowSparse(rows, nullptr, 0, again.data());
    if (again.size() != body_size || std::memcmp(again.data(), body, body_size) != 0) {
      Fail("a decoded request did not encode back to its bytes");
    }
  } catch (const dtrain::ProtocolError&) {
  }
  return 0;
}

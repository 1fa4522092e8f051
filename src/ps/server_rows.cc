// Server: row-sparse requests on a matrix's slots (server.h has the model; ps/row_sparse_body.h
// the bodies). A dist_sync round of row pushes sums the rows every worker pushed (the union of
// their ids, repeats added) and hands the optimizer those rows only: MXNet's lazy_update
// (Optimizer::UpdateRows), or, with lazy_update 0, the dense update of a gradient that is zero
// in the other rows. Without an optimizer the round's sum becomes the value, as for dense pushes.
// Row pulls answer the rows asked for, in the order asked, after the round their worker pushed
// into. A round that mixes dense and row pushes is summed densely.
#include <algorithm>
#include <cstring>
#include <span>

#include "common/elementwise.h"
#include "compression/codec.h"
#include "dtrain/common/error.h"
#include "ps/row_sparse_body.h"
#include "ps/server.h"
#include "ps/server_slot.h"

namespace dtrain::ps {

using transport::Body;
using transport::Command;
using transport::Header;
using transport::Message;

namespace {

// A row push's ids and rows, checked against the slot; compressed rows are checked (their size
// and codes) but left packed.
RowSparseView ViewPushedRows(const Header& h, const Body& body, int64_t slot_rows,
                             int64_t row_length, size_t row_bytes) {
  if (h.compression == Compression::kNone) {
    return DecodeRowSparse(body.data, body.size, slot_rows, row_bytes);
  }
  RowSparseView view = DecodeRowSparseIds(body.data, body.size, slot_rows);
  const auto n = static_cast<int64_t>(view.rows.size()) * row_length;
  if (static_cast<int64_t>(h.elements) != n ||
      view.values_bytes != CompressedBytes(h.compression, n)) {
    throw ProtocolError("a compressed row push of " + std::to_string(view.rows.size()) +
                        " rows of " + std::to_string(row_length) + " announces " +
                        std::to_string(h.elements) + " values in " +
                        std::to_string(view.values_bytes) + " bytes");
  }
  if (!WellFormed(h.compression, view.values, n)) {
    throw ProtocolError("a compressed row push holds codes its format does not have");
  }
  return view;
}

// A row push's rows, unpacked first when they came compressed.
struct PushedRows {
  RowSparseView view;
  std::vector<char> unpacked;
};

PushedRows DecodePushedRows(const Header& h, const Body& body, int64_t slot_rows,
                            int64_t row_length, size_t row_bytes) {
  PushedRows out{ViewPushedRows(h, body, slot_rows, row_length, row_bytes), {}};
  if (h.compression == Compression::kNone) return out;
  const auto n = static_cast<int64_t>(out.view.rows.size()) * row_length;
  out.unpacked.resize(static_cast<size_t>(n) * sizeof(float));
  dtrain::Decompress({h.compression, h.threshold}, out.view.values, n,
                     reinterpret_cast<float*>(out.unpacked.data()), /*accumulate=*/false);
  out.view.values = out.unpacked.data();
  out.view.row_bytes = row_bytes;
  out.view.values_bytes = out.unpacked.size();
  return out;
}

std::span<float> Floats(Body& b, int64_t n) {
  return {reinterpret_cast<float*>(b.data), static_cast<size_t>(n)};
}

}  // namespace

size_t Server::RowsBodyLimit(const Header& h) {
  std::shared_lock<std::shared_mutex> lock(slots_mutex_);
  auto it = slots_.find({h.key, h.part});
  if (it == slots_.end() || it->second->row_length == 0) return 0;
  const SlotState& slot = *it->second;
  // A worker sends each row once (its front end sums repeats); a server accepts repeats within
  // this bound.
  return RowSparseBytes(static_cast<size_t>(slot.rows()),
                        h.command == Command::kPushRows ? slot.row_bytes() : 0);
}

std::string Server::RowRequestProblem(const SlotState& slot, const Message& msg) {
  const Header& h = msg.header;
  const std::string what = std::string(CommandName(h.command)) + " to " + SlotName(h.key, h.part);
  if (slot.row_length == 0) {
    return what +
           ": it was not initialised as a matrix (its rows are unknown; row-sparse "
           "requests need a value of two or more dimensions)";
  }
  if ((h.flags & transport::kFlagBodyRefused) != 0) {
    return what + " refused: " + msg.meta + " (it holds " + std::to_string(slot.rows()) +
           " rows of " + std::to_string(slot.row_length) + ")";
  }
  if (h.compression != Compression::kNone &&
      (h.command != Command::kPushRows || slot.dtype != DType::kFloat32)) {
    return what + ": only float32 rows are pushed compressed; it holds " +
           std::string(DTypeName(slot.dtype));
  }
  if (h.command == Command::kPushRows && h.dtype != slot.dtype) {
    return what + " carries " + std::string(DTypeName(h.dtype)) + " rows; it holds " +
           std::string(DTypeName(slot.dtype));
  }
  try {
    if (h.command == Command::kPushRows) {
      ViewPushedRows(h, msg.body, slot.rows(), slot.row_length, slot.row_bytes());
    } else {
      DecodeRowRequest(msg.body.data, msg.body.size, slot.rows());
    }
  } catch (const ProtocolError& e) {
    return what + ": " + e.what();
  }
  return {};
}

void Server::AccumulateRows(SlotState& slot, const Message& msg) {
  const PushedRows decoded =
      DecodePushedRows(msg.header, msg.body, slot.rows(), slot.row_length, slot.row_bytes());
  const RowSparseView& pushed = decoded.view;
  const size_t row_bytes = slot.row_bytes();
  if (slot.merged.owner) {  // a dense push came first this round
    for (size_t i = 0; i < pushed.rows.size(); ++i) {
      AddInto(slot.merged.data + static_cast<size_t>(pushed.rows[i]) * row_bytes, pushed.row(i),
              slot.row_length, slot.dtype);
    }
    return;
  }
  if (!slot.row_sums.owner) {
    slot.row_sums = NewBuffer(slot.bytes());
    std::memset(slot.row_sums.data, 0, slot.bytes());
    slot.row_touched.assign(static_cast<size_t>(slot.rows()), 0);
  }
  slot.rows_round = true;
  for (size_t i = 0; i < pushed.rows.size(); ++i) {
    const auto row = static_cast<size_t>(pushed.rows[i]);
    if (!slot.row_touched[row]) {
      slot.row_touched[row] = 1;
      slot.touched.push_back(pushed.rows[i]);
    }
    AddInto(slot.row_sums.data + row * row_bytes, pushed.row(i), slot.row_length, slot.dtype);
  }
}

void Server::DenseRound(SlotState& slot) {
  slot.merged = std::move(slot.row_sums);  // zero outside the rows pushed: the dense sum so far
  slot.row_sums = Body{};
  for (int64_t row : slot.touched) slot.row_touched[static_cast<size_t>(row)] = 0;
  slot.touched.clear();
  slot.rows_round = false;
}

void Server::ClearRowSums(SlotState& slot) {
  const size_t row_bytes = slot.row_bytes();
  for (int64_t row : slot.touched) {
    std::memset(slot.row_sums.data + static_cast<size_t>(row) * row_bytes, 0, row_bytes);
    slot.row_touched[static_cast<size_t>(row)] = 0;
  }
  slot.touched.clear();
  slot.rows_round = false;
}

void Server::ApplyRowRound(SlotState& slot) {
  std::vector<int64_t> rows = slot.touched;
  std::sort(rows.begin(), rows.end());
  const size_t row_bytes = slot.row_bytes();
  std::vector<char> sums(rows.size() * row_bytes);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(sums.data() + i * row_bytes,
                slot.row_sums.data + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  }
  CopyOnWrite(slot);
  if (std::shared_ptr<Optimizer> optimizer = CurrentOptimizer()) {
    if (slot.dtype != DType::kFloat32) {
      ClearRowSums(slot);
      throw InvalidArgument("optimizers support float32 values only, " +
                            SlotName(slot.key, slot.part) + " is " +
                            std::string(DTypeName(slot.dtype)));
    }
    slot.value_holds_rows = false;
    std::shared_lock<std::shared_mutex> state_lock(optimizer_state_mutex_);
    if (optimizer->lazy_update()) {
      optimizer->UpdateRows(
          slot.optimizer_index(), Floats(slot.value, slot.length),
          static_cast<size_t>(slot.row_length), rows,
          {reinterpret_cast<const float*>(sums.data()), rows.size() * slot.row_length});
    } else {
      optimizer->Update(slot.optimizer_index(), Floats(slot.value, slot.length),
                        Floats(slot.row_sums, slot.length));
    }
  } else {
    // The value becomes the round's sum: zero but in the rows pushed.
    if (!slot.value_holds_rows) {
      std::memset(slot.value.data, 0, slot.bytes());
      slot.value_holds_rows = true;
    } else {
      for (int64_t row : slot.value_rows) {
        std::memset(slot.value.data + static_cast<size_t>(row) * row_bytes, 0, row_bytes);
      }
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(slot.value.data + static_cast<size_t>(rows[i]) * row_bytes,
                  sums.data() + i * row_bytes, row_bytes);
    }
    slot.value_rows = std::move(rows);
  }
  ClearRowSums(slot);
}

void Server::ApplyPushedRows(SlotState& slot, const Message& msg) {
  const PushedRows decoded =
      DecodePushedRows(msg.header, msg.body, slot.rows(), slot.row_length, slot.row_bytes());
  const CoalescedRows rows = CoalesceRows(decoded.view.rows, decoded.view.values,
                                          decoded.view.row_bytes, slot.row_length, slot.dtype);
  const size_t row_bytes = slot.row_bytes();
  CopyOnWrite(slot);
  slot.value_holds_rows = false;
  std::shared_ptr<Optimizer> optimizer = CurrentOptimizer();
  if (!optimizer) {  // the value is the total of all pushes
    for (size_t i = 0; i < rows.rows.size(); ++i) {
      AddInto(slot.value.data + static_cast<size_t>(rows.rows[i]) * row_bytes,
              rows.values.data() + i * row_bytes, slot.row_length, slot.dtype);
    }
    return;
  }
  if (slot.dtype != DType::kFloat32) {
    throw InvalidArgument("optimizers support float32 values only, " +
                          SlotName(slot.key, slot.part) + " is " +
                          std::string(DTypeName(slot.dtype)));
  }
  std::shared_lock<std::shared_mutex> state_lock(optimizer_state_mutex_);
  const std::span<const float> grads{reinterpret_cast<const float*>(rows.values.data()),
                                     rows.rows.size() * slot.row_length};
  if (optimizer->lazy_update()) {
    optimizer->UpdateRows(slot.optimizer_index(), Floats(slot.value, slot.length),
                          static_cast<size_t>(slot.row_length), rows.rows, grads);
    return;
  }
  std::vector<float> dense(static_cast<size_t>(slot.length), 0.f);
  for (size_t i = 0; i < rows.rows.size(); ++i) {
    std::copy_n(grads.begin() + static_cast<std::ptrdiff_t>(i * slot.row_length), slot.row_length,
                dense.begin() + static_cast<std::ptrdiff_t>(rows.rows[i] * slot.row_length));
  }
  optimizer->Update(slot.optimizer_index(), Floats(slot.value, slot.length), dense);
}

void Server::ReplyRows(SlotState& slot, const Header& request, const std::vector<int64_t>& rows) {
  const size_t row_bytes = slot.row_bytes();
  Body body = NewBuffer(rows.size() * row_bytes);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(body.data + i * row_bytes,
                slot.value.data + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  }
  Reply(request, std::move(body));
}

}  // namespace dtrain::ps

// DistKVStore's row-sparse push and pull (KVStore::PushRows, PullRows): only the rows asked for
// travel. The worker sums repeated rows first, so that a server gets each row at most once (its
// body limit), splits the rows by slot (every slot holds whole rows: KeyPartition) and numbers
// them from the slot's first row (ps/row_sparse_body.h).
#include <algorithm>
#include <cstring>

#include "compression/codec.h"
#include "dtrain/common/error.h"
#include "kvstore/dist_kvstore.h"
#include "kvstore/key_names.h"
#include "kvstore/operation_state.h"
#include "ps/row_sparse_body.h"

namespace dtrain {

using transport::Body;
using transport::Command;
using transport::Message;

namespace {

// A slot's share of a key's rows `unique` (sorted, distinct): where it starts in `unique`, the
// slot's first row, and its rows numbered from there (every slot holds whole rows).
struct SlotShare {
  int64_t lo = 0;
  int64_t first = 0;
  std::vector<int64_t> local;
};

SlotShare ShareOf(const std::vector<int64_t>& unique, const ps::Slot& slot, int64_t row_elements) {
  SlotShare share;
  share.first = slot.offset / row_elements;
  const int64_t end = (slot.offset + slot.length) / row_elements;
  const auto lo = std::lower_bound(unique.begin(), unique.end(), share.first);
  share.lo = lo - unique.begin();
  share.local.assign(lo, std::lower_bound(lo, unique.end(), end));
  for (int64_t& row : share.local) row -= share.first;
  return share;
}

// A row push or pull of `slot`, its body still to come.
Message RowRequest(Command command, Key key, const ps::Slot& slot, DType dtype, int priority) {
  Message msg;
  msg.header.priority = static_cast<int16_t>(std::clamp(priority, -32768, 32767));
  msg.header.command = command;
  msg.header.key = static_cast<uint64_t>(key);
  msg.header.part = slot.part;
  msg.header.dtype = dtype;
  return msg;
}

}  // namespace

const DistKVStore::KeyInfo& DistKVStore::LookupRows(Key key, const char* op,
                                                    const std::vector<int64_t>& rows,
                                                    const Array& values) const {
  const KeyInfo& info = Lookup(key, op);
  const std::string what = std::string(op) + " of key " + KeyLabel(key);
  if (info.row_elements == 0) {
    throw InvalidArgument(what + ": its value of shape " + ShapeToString(info.shape) +
                          " is not a matrix (rows need two or more dimensions)");
  }
  const int64_t total = info.shape.front();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= total) {
      throw InvalidArgument(what + ": row " + std::to_string(rows[i]) + " (at " +
                            std::to_string(i) + ") is outside its " + std::to_string(total) +
                            " rows");
    }
  }
  values.RequireHost(what.c_str());
  if (values.dtype() != info.dtype ||
      values.size() != static_cast<int64_t>(rows.size()) * info.row_elements) {
    throw InvalidArgument(what + ": " + std::to_string(rows.size()) + " rows of " +
                          std::to_string(info.row_elements) + " " +
                          std::string(DTypeName(info.dtype)) + " need as many values; got " +
                          std::to_string(values.size()) + " " +
                          std::string(DTypeName(values.dtype())));
  }
  return info;
}

Operation DistKVStore::PushRows(Key key, std::vector<int64_t> rows, const Array& values,
                                int priority) {
  const KeyInfo& info = LookupRows(key, "push of rows", rows, values);
  node_.ThrowIfFailed();
  const size_t row_bytes = static_cast<size_t>(info.row_elements) * DTypeSize(info.dtype);
  const ps::CoalescedRows coalesced =
      ps::CoalesceRows(rows, values.bytes(), row_bytes, info.row_elements, info.dtype);
  const std::vector<int64_t>& unique = coalesced.rows;
  CompressionSpec compression;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    compression = PushCompression(key, info, "push of rows");
  }
  auto state = Track(
      "push of " + std::to_string(unique.size()) + " rows of key " + KeyLabel(key) + info.servers,
      static_cast<int>(info.slots.size()));
  for (const ps::Slot& slot : info.slots) {
    const SlotShare share = ShareOf(unique, slot, info.row_elements);
    Message msg = RowRequest(Command::kPushRows, key, slot, info.dtype, priority);
    const char* values = coalesced.values.data() + static_cast<size_t>(share.lo) * row_bytes;
    if (compression.enabled() && !share.local.empty()) {
      msg.body = CompressedRows(info, compression, share.local, share.first, values, &msg.header);
    } else {
      msg.body = NewPushBody(info, ps::RowSparseBytes(share.local.size(), row_bytes));
      ps::EncodeRowSparse(share.local, values, row_bytes, msg.body.data);
    }
    client_.Request(
        slot.server, std::move(msg), Body{},
        [state](const Message*, std::exception_ptr error) { state->PartDone(error); },
        /*log_push=*/log_pushes_);
  }
  return Operation(state);
}

Body DistKVStore::CompressedRows(const KeyInfo& info, const CompressionSpec& spec,
                                 const std::vector<int64_t>& local, int64_t first,
                                 const char* values, transport::Header* header) {
  const auto length = static_cast<size_t>(info.row_elements);
  const size_t n = local.size() * length;
  if (n > UINT32_MAX) {
    throw InvalidArgument("a compressed push of " + std::to_string(local.size()) + " rows of " +
                          std::to_string(length) + " values is over 2^32 values");
  }
  const size_t ids = ps::RowSparseBytes(local.size(), 0);
  Body out = NewPushBody(info, ids + CompressedBytes(spec.type, static_cast<int64_t>(n)));
  ps::EncodeRowSparse(local, nullptr, 0, out.data);
  // Error feedback per element of the key, as the dense path keeps it: these rows' residuals,
  // gathered, compressed with the rows, and put back.
  Residual& residual = *info.residual;
  std::lock_guard<std::mutex> lock(residual.mutex);
  if (residual.values.empty()) {
    residual.values.assign(static_cast<size_t>(info.shape[0]) * length, 0.f);
  }
  std::vector<float> kept(n);
  for (size_t i = 0; i < local.size(); ++i) {
    const auto row = static_cast<size_t>(local[i] + first);
    std::copy_n(residual.values.begin() + static_cast<std::ptrdiff_t>(row * length), length,
                kept.begin() + static_cast<std::ptrdiff_t>(i * length));
  }
  Compress(spec, reinterpret_cast<const float*>(values), kept.data(), static_cast<int64_t>(n),
           out.data + ids);
  for (size_t i = 0; i < local.size(); ++i) {
    const auto row = static_cast<size_t>(local[i] + first);
    std::copy_n(kept.begin() + static_cast<std::ptrdiff_t>(i * length), length,
                residual.values.begin() + static_cast<std::ptrdiff_t>(row * length));
  }
  header->compression = spec.type;
  header->threshold = spec.threshold;
  header->elements = static_cast<uint32_t>(n);
  return out;
}

Operation DistKVStore::PullRows(Key key, std::vector<int64_t> rows, const Array& out,
                                int priority) {
  const KeyInfo& info = LookupRows(key, "pull of rows", rows, out);
  node_.ThrowIfFailed();
  const size_t row_bytes = static_cast<size_t>(info.row_elements) * DTypeSize(info.dtype);
  // Each row asked once; the answer is copied to every place it was asked for.
  const std::vector<size_t> order = ps::SortedRowOrder(rows);
  std::vector<int64_t> unique;
  std::vector<std::vector<size_t>> places;  // per unique row: where it goes in `out`
  for (size_t i : order) {
    if (unique.empty() || unique.back() != rows[i]) {
      unique.push_back(rows[i]);
      places.emplace_back();
    }
    places.back().push_back(i);
  }
  std::vector<std::pair<const ps::Slot*, SlotShare>> requests;  // the slots with rows asked
  for (const ps::Slot& slot : info.slots) {
    SlotShare share = ShareOf(unique, slot, info.row_elements);
    if (!share.local.empty()) requests.emplace_back(&slot, std::move(share));
  }
  auto state = Track(
      "pull of " + std::to_string(unique.size()) + " rows of key " + KeyLabel(key) + info.servers,
      std::max<int>(1, static_cast<int>(requests.size())));
  if (requests.empty()) state->PartDone();
  auto shared_places = std::make_shared<std::vector<std::vector<size_t>>>(std::move(places));
  for (const auto& [slot, share] : requests) {
    const std::vector<int64_t>& local = share.local;
    Message msg = RowRequest(Command::kPullRows, key, *slot, info.dtype, priority);
    msg.body = NewPushBody(info, ps::RowSparseBytes(local.size(), 0));
    ps::EncodeRowSparse(local, nullptr, 0, msg.body.data);
    Body reply = NewPushBody(info, local.size() * row_bytes);
    auto done = [state, out, reply, shared_places, lo = share.lo, row_bytes](
                    const Message*, std::exception_ptr error) {
      if (!error) {
        for (size_t i = 0; i < reply.size / row_bytes; ++i) {
          for (size_t place : (*shared_places)[static_cast<size_t>(lo) + i]) {
            std::memcpy(out.bytes() + place * row_bytes, reply.data + i * row_bytes, row_bytes);
          }
        }
      }
      state->PartDone(error);
    };
    client_.Request(slot->server, std::move(msg), reply, std::move(done));
  }
  return Operation(state);
}

}  // namespace dtrain

#include "ps/key_partition.h"

#include <algorithm>

#include "common/error.h"

namespace dtrain::ps {

KeyPartition::KeyPartition(int num_servers, int64_t bigarray_bound, size_t chunk_bytes)
    : num_servers_(num_servers),
      bigarray_bound_(bigarray_bound),
      chunk_bytes_(chunk_bytes),
      bytes_per_server_(std::max(num_servers, 0), 0) {  // the check below runs after this
  if (num_servers < 1) throw InvalidArgument("a job needs at least one server");
}

void KeyPartition::Cut(int server, int64_t offset, int64_t length, size_t elem_size,
                       std::vector<Slot>* out) {
  // Pieces of equal size (to within one element), each at most chunk_bytes_.
  const int64_t max_elems = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes_ / elem_size));
  const int64_t pieces = std::max<int64_t>(1, (length + max_elems - 1) / max_elems);
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t begin = length * i / pieces;
    const int64_t end = length * (i + 1) / pieces;
    out->push_back(Slot{server, static_cast<uint32_t>(out->size()), offset + begin, end - begin});
  }
  bytes_per_server_[server] += static_cast<uint64_t>(length) * elem_size;
}

const std::vector<Slot>& KeyPartition::Add(uint64_t key, int64_t elements, DType dtype) {
  if (slots_.count(key) != 0) {
    throw InvalidArgument("key " + std::to_string(key) + " is already initialised");
  }
  const size_t elem_size = DTypeSize(dtype);
  std::vector<Slot> slots;
  if (elements < bigarray_bound_ || num_servers_ == 1) {
    const int server = static_cast<int>(
        std::min_element(bytes_per_server_.begin(), bytes_per_server_.end()) -
        bytes_per_server_.begin());
    Cut(server, 0, elements, elem_size, &slots);
  } else {
    for (int s = 0; s < num_servers_; ++s) {
      const int64_t begin = elements * s / num_servers_;
      const int64_t end = elements * (s + 1) / num_servers_;
      Cut(s, begin, end - begin, elem_size, &slots);
    }
  }
  return slots_[key] = std::move(slots);
}

const std::vector<Slot>* KeyPartition::Find(uint64_t key) const {
  auto it = slots_.find(key);
  return it == slots_.end() ? nullptr : &it->second;
}

}  // namespace dtrain::ps

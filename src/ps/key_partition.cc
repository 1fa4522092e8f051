#include "ps/key_partition.h"

#include <algorithm>
#include <numeric>

#include "compression/codec.h"
#include "dtrain/common/error.h"

namespace dtrain::ps {

KeyPartition::KeyPartition(int num_servers, int64_t bigarray_bound, size_t chunk_bytes,
                           size_t partition_bytes)
    : num_servers_(num_servers),
      bigarray_bound_(bigarray_bound),
      chunk_bytes_(chunk_bytes),
      partition_bytes_(partition_bytes),
      bytes_per_server_(std::max(num_servers, 0), 0) {  // the check below runs after this
  if (num_servers < 1) throw InvalidArgument("a job needs at least one server");
  for (size_t bytes : {chunk_bytes, partition_bytes == 0 ? chunk_bytes : partition_bytes}) {
    if (bytes < kCompressionAlignment * sizeof(double)) {
      throw InvalidArgument("slots must hold at least " + std::to_string(kCompressionAlignment) +
                            " elements; " + std::to_string(bytes) + " bytes is too small");
    }
  }
}

namespace {

// The start of piece `part` of `parts` of `elements`: the elements are counted in words of `unit`
// (kCompressionAlignment, or a multiple of it for a matrix's rows; the last word may be partial)
// and the words shared out evenly, so every boundary falls on a whole word and no piece has more
// than ceil(words / parts) words.
int64_t AlignedBoundary(int64_t elements, int64_t part, int64_t parts, int64_t unit) {
  const int64_t words = (elements + unit - 1) / unit;
  return std::min(elements, words * part / parts * unit);
}

}  // namespace

void KeyPartition::Cut(int server, int64_t offset, int64_t length, size_t elem_size, int64_t unit,
                       std::vector<Slot>* out) {
  // Pieces of equal size (to within one word), each at most chunk_bytes_ unless a word is bigger.
  const int64_t max_words =
      std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes_ / elem_size) / unit);
  const int64_t words = (length + unit - 1) / unit;
  const int64_t pieces = std::max<int64_t>(1, (words + max_words - 1) / max_words);
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t begin = AlignedBoundary(length, i, pieces, unit);
    const int64_t end = AlignedBoundary(length, i + 1, pieces, unit);
    out->push_back(Slot{server, static_cast<uint32_t>(out->size()), offset + begin, end - begin});
  }
  bytes_per_server_[server] += static_cast<uint64_t>(length) * elem_size;
}

int KeyPartition::LeastLoadedServerWithout(std::vector<bool>* holds_part) const {
  if (std::find(holds_part->begin(), holds_part->end(), false) == holds_part->end()) {
    holds_part->assign(holds_part->size(), false);  // every server has one: a new round
  }
  int best = -1;
  for (int s = 0; s < num_servers_; ++s) {
    if (!(*holds_part)[s] && (best < 0 || bytes_per_server_[s] < bytes_per_server_[best])) best = s;
  }
  (*holds_part)[best] = true;
  return best;
}

const std::vector<Slot>& KeyPartition::Add(uint64_t key, int64_t elements, DType dtype,
                                           int64_t row_elements) {
  if (slots_.count(key) != 0) {
    throw InvalidArgument("key " + std::to_string(key) + " is already initialised");
  }
  if (row_elements < 1 || elements % row_elements != 0) {
    throw InvalidArgument("key " + std::to_string(key) + ": rows of " +
                          std::to_string(row_elements) + " elements do not divide its " +
                          std::to_string(elements));
  }
  const size_t elem_size = DTypeSize(dtype);
  const int64_t unit = std::lcm(int64_t{kCompressionAlignment}, row_elements);
  std::vector<Slot> slots;
  if (num_servers_ == 1) {
    Cut(0, 0, elements, elem_size, unit, &slots);
  } else if (elements < bigarray_bound_) {
    const uint64_t bytes = static_cast<uint64_t>(elements) * elem_size;
    const int64_t words = (elements + unit - 1) / unit;
    int64_t parts = 1;
    if (partition_bytes_ > 0 && bytes > partition_bytes_) {
      // At least one part per server: a key big enough to split loads every server's link evenly.
      parts = std::max<int64_t>(
          num_servers_, static_cast<int64_t>((bytes + partition_bytes_ - 1) / partition_bytes_));
      parts = std::clamp<int64_t>(parts, 1, std::max<int64_t>(1, words));
    }
    std::vector<bool> holds_part(num_servers_, false);
    for (int64_t i = 0; i < parts; ++i) {
      const int64_t begin = AlignedBoundary(elements, i, parts, unit);
      const int64_t end = AlignedBoundary(elements, i + 1, parts, unit);
      Cut(LeastLoadedServerWithout(&holds_part), begin, end - begin, elem_size, unit, &slots);
    }
  } else {
    for (int s = 0; s < num_servers_; ++s) {
      const int64_t begin = AlignedBoundary(elements, s, num_servers_, unit);
      const int64_t end = AlignedBoundary(elements, s + 1, num_servers_, unit);
      if (end > begin) Cut(s, begin, end - begin, elem_size, unit, &slots);
    }
  }
  return slots_[key] = std::move(slots);
}

const std::vector<Slot>* KeyPartition::Find(uint64_t key) const {
  auto it = slots_.find(key);
  return it == slots_.end() ? nullptr : &it->second;
}

}  // namespace dtrain::ps

// KeyPartition: where each part of each key lives.
//
// A key smaller than MXNET_KVSTORE_BIGARRAY_BOUND elements goes whole to one server, the one with
// the fewest bytes so far, so servers get an even share of bytes (MXNet picks at random). A bigger
// key is split into num_servers nearly equal ranges, one per server. Then every range is cut into
// pieces of at most DTRAIN_CHUNK_BYTES: each piece is a "slot" the server treats on its own, so a
// server can answer the first pieces of a big value while the last ones are still arriving, and
// pieces travel over different TCP streams in parallel.
//
// Every worker computes the same placement because every worker adds the same keys with the same
// sizes in the same order (MXNet requires the same; a worker that differs gets "never initialised"
// errors from the servers, not silent corruption).
//
// Not thread-safe: the KVStore calls Add under its own lock.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"

namespace dtrain::ps {

struct Slot {
  int server = 0;      // server rank
  uint32_t part = 0;   // index of this slot within the key
  int64_t offset = 0;  // first element
  int64_t length = 0;  // elements
};

class KeyPartition {
 public:
  KeyPartition(int num_servers, int64_t bigarray_bound, size_t chunk_bytes);

  // Places a new key; returns its slots (in order of offset).
  const std::vector<Slot>& Add(uint64_t key, int64_t elements, DType dtype);
  // nullptr if the key was never added.
  const std::vector<Slot>* Find(uint64_t key) const;

  const std::vector<uint64_t>& bytes_per_server() const { return bytes_per_server_; }

 private:
  void Cut(int server, int64_t offset, int64_t length, size_t elem_size, std::vector<Slot>* out);

  const int num_servers_;
  const int64_t bigarray_bound_;
  const size_t chunk_bytes_;
  std::vector<uint64_t> bytes_per_server_;
  std::unordered_map<uint64_t, std::vector<Slot>> slots_;
};

}  // namespace dtrain::ps

// KeyPartition: where each part of each key lives.
//
// A key smaller than MXNET_KVSTORE_BIGARRAY_BOUND elements goes to the server with the fewest bytes
// so far, so servers get an even share of bytes (MXNet picks at random); if it is bigger than
// DTRAIN_PARTITION_BYTES it is first split into nearly equal parts, as many as there are servers
// or more so that none is bigger than that (BytePS's partitioning), each on the least loaded
// server that holds no other part of it yet: whole keys of a few hundred KB to a few MB would
// otherwise load one server's link well past the others', and a key spread over every server
// moves through every link at once. A key at or over the bound is split into
// num_servers nearly equal ranges, one per server, as in MXNet. Then every part is cut into
// pieces of at most DTRAIN_CHUNK_BYTES (rounded down to whole words of compressed values): each
// piece is a "slot" the server treats on its own, so a server can answer the first pieces of a big
// value while the last ones are still arriving, and pieces travel over different TCP streams in
// parallel.
//
// Boundaries between ranges and pieces are multiples of kCompressionAlignment (32) elements, so
// that a compressed push of a whole key slices into whole words, one slice per slot. A key of
// fewer than 32 * num_servers elements over the bound may leave some servers without a range.
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

#include "dtrain/common/dtype.h"

namespace dtrain::ps {

struct Slot {
  int server = 0;      // server rank
  uint32_t part = 0;   // index of this slot within the key
  int64_t offset = 0;  // first element
  int64_t length = 0;  // elements
};

class KeyPartition {
 public:
  // Throws InvalidArgument for no servers, or chunk_bytes or a non-zero partition_bytes under 256
  // (32 float64 elements). partition_bytes 0: keys under the bound go whole to one server.
  KeyPartition(int num_servers, int64_t bigarray_bound, size_t chunk_bytes,
               size_t partition_bytes = 0);

  // Places a new key; returns its slots (in order of offset). `row_elements` > 1: the key is a
  // matrix of rows that long, and every boundary falls between rows too (a multiple of the least
  // common multiple of the row and kCompressionAlignment), so that every slot holds whole rows
  // (row-sparse pushes and pulls, ps/row_sparse_body.h).
  const std::vector<Slot>& Add(uint64_t key, int64_t elements, DType dtype,
                               int64_t row_elements = 1);
  // nullptr if the key was never added.
  const std::vector<Slot>* Find(uint64_t key) const;

  const std::vector<uint64_t>& bytes_per_server() const { return bytes_per_server_; }

 private:
  // Cuts [offset, offset + length) into pieces of at most chunk_bytes_ (at least one `unit`),
  // boundaries at multiples of `unit` elements.
  void Cut(int server, int64_t offset, int64_t length, size_t elem_size, int64_t unit,
           std::vector<Slot>* out);
  // The server with the fewest bytes among those not marked in `holds_part` (all of them once
  // every one is marked); marks it.
  int LeastLoadedServerWithout(std::vector<bool>* holds_part) const;

  const int num_servers_;
  const int64_t bigarray_bound_;
  const size_t chunk_bytes_;
  const size_t partition_bytes_;
  std::vector<uint64_t> bytes_per_server_;
  std::unordered_map<uint64_t, std::vector<Slot>> slots_;
};

}  // namespace dtrain::ps

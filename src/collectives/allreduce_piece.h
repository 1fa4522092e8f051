// One tensor of a fused allreduce. The pieces of one call are reduced as if they were one array,
// end to end, so that a backend that can reach each tensor where it lies (the shared memory
// segment of one host, shm_group.h) copies each once into the segment and once back, with no
// fusion buffer between.
#pragma once

#include <cstddef>
#include <span>

namespace dtrain::collectives {

struct AllreducePiece {
  const void* in;  // `count` elements
  void* out;       // `count` elements; in == out: in place
  size_t count;
};

}  // namespace dtrain::collectives

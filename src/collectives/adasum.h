// Adasum, Horovod's op=Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
// Summation", MLSys 2021): a reduction of gradients that sums what is orthogonal and averages what
// is parallel, so that the update of N workers stays near one worker's when their gradients agree.
//
// Two ranks' values a and b combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, with the dot
// product and the norms of each tensor (layer) on its own, even when several tensors travel in one
// fusion buffer, accumulated in float64; a coefficient whose vector's squared norm is below
// sqrt(DBL_MIN) is 1 (a zero gradient leaves the other unchanged). N ranks (a power of two) combine
// as a binary tree over adjacent ranks, as Horovod's does: with 4, adasum(adasum(g0, g1),
// adasum(g2, g3)).
#pragma once

#include <cstddef>
#include <vector>

#include "dtrain/common/dtype.h"

namespace dtrain::collectives {

class Communicator;

// float16, float32 and float64 (Horovod's set).
bool AdasumTakes(DType dtype);
bool IsPowerOfTwo(int n);

// out = adasum(lower, higher), tensor by tensor: `counts` elements each, end to end. `out` may be
// `lower` or `higher`. The lower ranks' value goes first, so that both ranks of a pair compute the
// same bits.
void AdasumCombine(const void* lower, const void* higher, void* out,
                   const std::vector<size_t>& counts, DType dtype);

// `out` = the Adasum of every rank's `in` (tensors of `counts` elements end to end), on every
// rank of `comm`; `out` may be `in`. Recursive doubling: at distance d = 1, 2, 4, ... each rank
// swaps its partial result with rank ^ d and both combine the pair. Each rank sends its whole
// buffer log2(size) times (Horovod halves the vector at each level: about twice the buffer in
// all; the two are equal at 2 ranks). `comm`'s size must be a power of two. `scratch` receives
// the partner's values (grown as needed; callers keep it between calls).
void AdasumAllreduce(Communicator& comm, const void* in, void* out,
                     const std::vector<size_t>& counts, DType dtype, std::vector<char>& scratch);

}  // namespace dtrain::collectives

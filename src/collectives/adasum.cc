#include "collectives/adasum.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "collectives/backend.h"
#include "common/elementwise.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

// Below this a squared norm counts as zero. Horovod's bound: the smallest one whose reciprocal
// times a dot product of such vectors is still a normal double.
const double kZeroNormSquared = std::sqrt(std::numeric_limits<double>::min());

// One tensor: dot product and norms in float64, the update in float64 rounded once to T. The
// sums run in kLanes independent lanes (added up at the end): one chain of dependent additions
// would bound the loop by the adder's latency, and lanes let the compiler use vector registers.
template <typename T>
void CombineTensor(const T* a, const T* b, T* out, size_t n) {
  constexpr size_t kLanes = 8;
  double dots[kLanes] = {}, aas[kLanes] = {}, bbs[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double x = a[i + j], y = b[i + j];
      dots[j] += x * y;
      aas[j] += x * x;
      bbs[j] += y * y;
    }
  }
  double dot = 0, aa = 0, bb = 0;
  for (size_t j = 0; j < kLanes; ++j) {
    dot += dots[j];
    aa += aas[j];
    bb += bbs[j];
  }
  for (; i < n; ++i) {
    const double x = a[i], y = b[i];
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  const double ca = aa >= kZeroNormSquared ? 1.0 - dot / (2.0 * aa) : 1.0;
  const double cb = bb >= kZeroNormSquared ? 1.0 - dot / (2.0 * bb) : 1.0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<T>(ca * static_cast<double>(a[i]) + cb * static_cast<double>(b[i]));
  }
}

template <typename T>
void CombineAll(const T* a, const T* b, T* out, const std::vector<size_t>& counts) {
  size_t offset = 0;
  for (size_t n : counts) {
    CombineTensor(a + offset, b + offset, out + offset, n);
    offset += n;
  }
}

InvalidArgument UnsupportedDType(DType dtype) {
  return InvalidArgument("Adasum reduces float16, float32 and float64 values, not " +
                         std::string(DTypeName(dtype)));
}

}  // namespace

bool AdasumTakes(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kFloat32 || dtype == DType::kFloat64;
}

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

void AdasumCombine(const void* lower, const void* higher, void* out,
                   const std::vector<size_t>& counts, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return CombineAll(static_cast<const float*>(lower), static_cast<const float*>(higher),
                        static_cast<float*>(out), counts);
    case DType::kFloat64:
      return CombineAll(static_cast<const double*>(lower), static_cast<const double*>(higher),
                        static_cast<double*>(out), counts);
    case DType::kFloat16: {
      // In float32, rounded back to half once (as Horovod's half path).
      size_t total = 0;
      for (size_t n : counts) total += n;
      std::vector<float> a(total), b(total);
      HalfToFloat(static_cast<const uint16_t*>(lower), a.data(), total);
      HalfToFloat(static_cast<const uint16_t*>(higher), b.data(), total);
      CombineAll(a.data(), b.data(), a.data(), counts);
      FloatToHalf(a.data(), static_cast<uint16_t*>(out), total);
      return;
    }
    default:
      throw UnsupportedDType(dtype);
  }
}

void AdasumAllreduce(Communicator& comm, const void* in, void* out,
                     const std::vector<size_t>& counts, DType dtype, std::vector<char>& scratch) {
  const int size = comm.size();
  const int rank = comm.rank();
  if (!IsPowerOfTwo(size)) {
    throw InvalidArgument("Adasum needs a power-of-two number of ranks; this job has " +
                          std::to_string(size));
  }
  if (!AdasumTakes(dtype)) throw UnsupportedDType(dtype);
  size_t bytes = 0;
  for (size_t n : counts) bytes += n * DTypeSize(dtype);
  if (size == 1 || bytes == 0) {
    if (in != out && bytes > 0) std::memcpy(out, in, bytes);
    return;
  }
  // Kept by the caller from call to call: a fresh buffer would cost its page faults every time.
  if (scratch.size() < bytes) scratch.resize(bytes);
  char* theirs = scratch.data();
  // The first level reads `in` and writes `out`, the later ones work in `out`: no copy of `in`.
  const void* mine = in;
  for (int distance = 1; distance < size; distance <<= 1) {
    const int partner = rank ^ distance;
    std::vector<size_t> exchanged(size, 0);
    exchanged[partner] = bytes;
    comm.Alltoallv(mine, exchanged, theirs, exchanged);
    if (rank < partner) {
      AdasumCombine(mine, theirs, out, counts, dtype);
    } else {
      AdasumCombine(theirs, mine, out, counts, dtype);
    }
    mine = out;
  }
}

}  // namespace dtrain::collectives

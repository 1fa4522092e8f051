// GlooBackend's allreduce among a context's ranks (gloo_backend.h).
//
// Algorithm (DTRAIN_GLOO_ALGORITHM; default "auto"), measured with bench/allreduce_bench.sh on 2
// local processes, float32, median of many calls:
//
//                     4 KB    64 KB   1 MB    4 MB    16 MB    64 MB
//   ring              244us   269us   584us   2.5ms   12.4ms   43.6ms
//   bcube             176us   224us   442us   2.1ms   11.4ms   61.8ms
//   ring_chunked      242us   281us   616us   4.1ms   14.0ms   53.6ms  (16 KB: 45-90 ms stalls)
//   halving_doubling  166us   196us   477us   2.0ms   10.7ms   50.5ms
//
// "auto" takes bcube below 16 MB and ring from there: both are gloo's option-based algorithms,
// which bind to any buffer per call. The class-based ring_chunked and halving_doubling must be
// built per buffer (their inboxes allocated, their slots registered); halving_doubling's small
// lead at small sizes does not pay for that with fusion buffers of changing size.
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>

#include <algorithm>
#include <cstdint>

#include "collectives/gloo/gloo_backend.h"
#include "common/elementwise.h"

namespace dtrain::collectives {
namespace {

constexpr size_t kAutoRingFromBytes = size_t{16} << 20;
// A bound on the cached class-based instances' buffer bytes (each also holds inboxes as large).
constexpr size_t kMaxCachedBytes = size_t{256} << 20;

// The reduction of the new-style gloo API: out = a (how) b for the dtype's elements.
gloo::AllreduceOptions::Func ReduceFunction(DType dtype, Reduction how) {
  if (how == Reduction::kSum) {
    return [dtype](void* out, const void* a, const void* b, size_t n) { Sum(out, a, b, n, dtype); };
  }
  return [dtype, how](void* out, const void* a, const void* b, size_t n) {
    Reduce(out, a, b, n, dtype, how);
  };
}

template <typename T>
void SetBuffers(gloo::AllreduceOptions& opts, std::unique_ptr<gloo::transport::UnboundBuffer> input,
                std::unique_ptr<gloo::transport::UnboundBuffer> output) {
  if (input) opts.setInput<T>(std::move(input));
  opts.setOutput<T>(std::move(output));
}

// A class-based algorithm (DTRAIN_GLOO_ALGORITHM ring_chunked or halving_doubling) over `count`
// elements at `data`.
template <typename T>
std::unique_ptr<gloo::Algorithm> MakeClassBased(const std::string& algorithm,
                                                const std::shared_ptr<gloo::Context>& context,
                                                void* data, int count) {
  std::vector<T*> ptrs{static_cast<T*>(data)};
  if (algorithm == "halving_doubling") {
    return std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context, ptrs, count);
  }
  return std::make_unique<gloo::AllreduceRingChunked<T>>(context, ptrs, count);
}

}  // namespace

void GlooBackend::GlooAllreduce(const std::shared_ptr<gloo::Context>& context, const void* in,
                                void* out, size_t count, DType dtype, Reduction how) {
  const bool bcube = algorithm_ == "bcube" ||
                     (algorithm_ == "auto" && count * DTypeSize(dtype) < kAutoRingFromBytes);
  gloo::AllreduceOptions opts(context);
  opts.setAlgorithm(bcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                          : gloo::AllreduceOptions::Algorithm::RING);
  const size_t bytes = count * DTypeSize(dtype);
  std::vector<gloo::transport::UnboundBuffer*> watched;
  auto output = Buffer(out, bytes, &watched, context);
  // Without an input gloo reduces the output in place.
  auto input = in == out ? nullptr : Buffer(const_cast<void*>(in), bytes, &watched, context);
  switch (dtype) {
    case DType::kFloat32:
      SetBuffers<float>(opts, std::move(input), std::move(output));
      break;
    case DType::kFloat64:
      SetBuffers<double>(opts, std::move(input), std::move(output));
      break;
    default:  // the two half types: only their size matters to gloo
      SetBuffers<uint16_t>(opts, std::move(input), std::move(output));
  }
  opts.setReduceFunction(ReduceFunction(dtype, how));
  opts.setTimeout(timeout_);
  // After the options that own the buffers, so that it ends before they do.
  GlooWatchdog::Call watch(watchdog_.get(), std::move(watched));
  gloo::allreduce(opts);
}

GlooBackend::Cached& GlooBackend::CachedAlgorithm(size_t count, DType dtype) {
  const auto key = std::make_pair(count, dtype);
  auto it = cached_.find(key);
  if (it != cached_.end()) return it->second;
  // Each instance holds inboxes as large as its buffer: bound what the cache keeps.
  if (cached_bytes_ + count * DTypeSize(dtype) > kMaxCachedBytes) {
    cached_.clear();
    cached_bytes_ = 0;
  }
  cached_bytes_ += count * DTypeSize(dtype);
  Cached cached;
  cached.buffer.resize(std::max<size_t>(count * DTypeSize(dtype), 1));
  void* data = cached.buffer.data();
  const int n = static_cast<int>(count);
  if (dtype == DType::kFloat32) {
    cached.algorithm = MakeClassBased<float>(algorithm_, context_, data, n);
  } else if (dtype == DType::kFloat64) {
    cached.algorithm = MakeClassBased<double>(algorithm_, context_, data, n);
  } else {
    cached.algorithm = MakeClassBased<gloo::float16>(algorithm_, context_, data, n);
  }
  return cached_.emplace(key, std::move(cached)).first->second;
}

}  // namespace dtrain::collectives

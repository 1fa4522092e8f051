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
// With more than 2 ranks the picture changes. 4 ranks over loopback TCP (DTRAIN_GLOO_SHM=0, the
// engine): halving_doubling 0.64-0.84 ms up to 256 KB and 1.7-1.9 ms at 1 MB, bcube 7.3-8.4 ms; 4
// emulated hosts at 10 Gbit/s (bench/cluster_bench.sh, hvd_allreduce_dtrain): 2.4 against 12.1 ms
// at 256 KB, 5.4 against 14.8 ms at 1 MB; from 4 MB the two were level, and from 16 MB ring was
// ahead. On 2 hosts the allreduce loop was level, but the MNIST example across 2 hosts at 1 Gbit/s
// trained at 11,200-12,100 samples/s against 8,000-9,000. Where the link decides (the emulated
// ResNet-50 step on 4 hosts at 100 Mbit/s) halving_doubling up to 2 MB cost 2.5% (1,391 against
// 1,357 ms, medians of 5), up to 512 KB nothing (1,353-1,372 against 1,352-1,376 ms): larger
// buffers are left to bcube. Its class-based instance sends gloo's old-style messages, which need
// no handshake with the receiver before the data, where each of the option-based algorithms'
// messages needs one. So "auto" sums below kAutoHalvingDoublingBelowBytes with halving_doubling,
// takes bcube up to 16 MB and ring from there. A class-based instance is built per buffer size (its
// inboxes allocated, its slots registered) and kept; fusion buffers of ever-changing sizes share a
// few by rounding the size up (BucketCount). Its first run may shrink the pairs' send buffers,
// which are then widened again (pair_sockets.h).
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "collectives/gloo/gloo_backend.h"
#include "collectives/gloo/pair_sockets.h"
#include "common/elementwise.h"

namespace dtrain::collectives {
namespace {

constexpr size_t kAutoRingFromBytes = size_t{16} << 20;
constexpr size_t kAutoHalvingDoublingBelowBytes = size_t{512} << 10;
// A bound on the cached class-based instances' buffer bytes (each also holds inboxes as large).
constexpr size_t kMaxCachedBytes = size_t{256} << 20;

// The element count a class-based instance is built for: `count` rounded up to one of 8 steps per
// doubling (at most 12.5% more), so that fusion buffers of ever-changing sizes share a few
// instances instead of building one each (100 tensors of 64 KB through the engine, 2 ranks over
// loopback TCP, whose fused batches vary: 10.2 ms with an instance per size, 4.5-5.9 ms with
// buckets, bcube 5.2-5.6 ms).
size_t BucketCount(size_t count) {
  if (count <= 64) return 64;
  const size_t step = size_t{1} << (std::bit_width(count) - 4);
  return (count + step - 1) / step * step;
}

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

void GlooBackend::GlooAllreduce(const std::shared_ptr<gloo::Context>& context, Among among,
                                const void* in, void* out, size_t count, DType dtype,
                                Reduction how) {
  const size_t bytes = count * DTypeSize(dtype);
  // The class-based algorithms only sum, and know no bfloat16.
  const size_t bucket = BucketCount(count);
  const bool summable = how == Reduction::kSum && bucket <= static_cast<size_t>(INT32_MAX) &&
                        dtype != DType::kBFloat16;
  std::string algorithm = algorithm_;
  if (algorithm == "auto") {
    algorithm = bytes >= kAutoRingFromBytes                          ? "ring"
                : summable && bytes < kAutoHalvingDoublingBelowBytes ? "halving_doubling"
                                                                     : "bcube";
  }
  if (summable && (algorithm == "ring_chunked" || algorithm == "halving_doubling")) {
    // They reduce their own buffer in place; building one registers it with every pair (in a
    // slot every rank must number alike), so it is kept for the next call of the same size bucket
    // and dtype, which every rank makes at the same point.
    Cached& cached = CachedAlgorithm(context, among, algorithm, bucket, dtype);
    // The rest of the bucket is left as it is: elements are summed only with their own kind.
    std::memcpy(cached.buffer.data(), in, bytes);
    const auto& sockets = among == Among::kLeaders ? leaders_sockets_ : members_sockets_;
    {
      // Its waits are on buffers gloo keeps to itself: when a rank has left (a host gone silent
      // closes no socket), the watchdog shuts the pairs down to end them.
      GlooWatchdog::Call watch(watchdog_.get(), {}, [&sockets] { ShutDown(sockets); });
      cached.algorithm->run();
    }
    if (!cached.ran) {
      cached.ran = true;
      WidenSendBuffers(sockets);
    }
    std::memcpy(out, cached.buffer.data(), bytes);
    return;
  }
  gloo::AllreduceOptions opts(context);
  opts.setAlgorithm(algorithm == "ring" ? gloo::AllreduceOptions::Algorithm::RING
                                        : gloo::AllreduceOptions::Algorithm::BCUBE);
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

GlooBackend::Cached& GlooBackend::CachedAlgorithm(const std::shared_ptr<gloo::Context>& context,
                                                  Among among, const std::string& algorithm,
                                                  size_t count, DType dtype) {
  const auto key = std::make_tuple(among, count, dtype);
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
    cached.algorithm = MakeClassBased<float>(algorithm, context, data, n);
  } else if (dtype == DType::kFloat64) {
    cached.algorithm = MakeClassBased<double>(algorithm, context, data, n);
  } else {
    cached.algorithm = MakeClassBased<gloo::float16>(algorithm, context, data, n);
  }
  return cached_.emplace(key, std::move(cached)).first->second;
}

}  // namespace dtrain::collectives

// What each collective that every rank agreed to run does with the backend (or NCCL): fusion
// batches of allreduces, allgathers, broadcasts, alltoalls and reducescatters. Run by the thread
// running a round (rounds.cc), under round_mutex.
#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>

#include "collectives/engine/engine_impl.h"
#include "common/elementwise.h"
#include "dtrain/common/error.h"
#include "report/timeline.h"

namespace dtrain::collectives {
namespace {

// Memory of our own rather than the BufferPool's: a collective may finish inside the exit
// handler, after the pool's static is gone.
Array NewHostArray(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  std::shared_ptr<char[]> memory(new char[std::max<size_t>(bytes, 1)]);
  return Array::Wrap(memory.get(), shape, dtype, memory);
}

// Bytes of one entry of the first dimension.
size_t RowBytes(const Descriptor& d) {
  return static_cast<size_t>(NumElements(Shape(d.shape.begin() + 1, d.shape.end()))) *
         DTypeSize(d.dtype);
}

}  // namespace

void Engine::Impl::RunFirstBatch() {
  if (runnable.empty()) return;
  const FusionBatch plan =
      PlanFirstBatch(runnable, rank, tuned.fusion_threshold_bytes, config.fp16_allreduce);
  std::deque<Request> stand_ins;
  std::vector<Request*> batch;
  for (size_t i : plan.members) {
    ReadyCollective& c = runnable[i];
    Request* r = nullptr;
    if (!c.joined.empty() && c.joined[rank]) {
      Request& stand_in = stand_ins.emplace_back();
      stand_in.name = c.name;
      stand_in.desc = c.descriptors[rank];  // what this rank stands in for
      stand_in.in = stand_in.out = StandIn(stand_in.desc);
      stand_in.state = std::make_shared<Handle::State>("allreduce '" + c.name + "' (joined)",
                                                       config.collective_timeout);
      r = &stand_in;
    } else {
      r = &pending.at(c.name);  // Execute checked that it is there
    }
    batch.push_back(r);
  }
  std::vector<ReadyCollective> later;
  for (size_t i : plan.later) later.push_back(std::move(runnable[i]));
  runnable = std::move(later);
  ReduceBatch(batch, plan.group);
}

void Engine::Impl::ReduceBatch(const std::vector<Request*>& batch, const FusionGroup& group) {
  data_calls.fetch_add(1, std::memory_order_relaxed);
  if (autotuner) {
    const Clock::time_point now = Clock::now();
    for (const Request* r : batch) autotuner->Record(r->name, r->in.nbytes(), now);
  }
  if (group.on_device) {
    std::vector<Array> ins, outs;
    size_t bytes = 0;
    for (const Request* r : batch) {
      ins.push_back(r->in);
      outs.push_back(r->out);
      bytes += r->in.nbytes();
    }
    {
      timeline::Span span("nccl_allreduce", "collectives",
                          timeline::Enabled()
                              ? timeline::Args().Int("tensors", batch.size()).Int("bytes", bytes)
                              : timeline::Args());
      Nccl().Allreduce(ins, outs, group.op);
    }
    if (batch.size() > 1) fused_tensors.fetch_add(batch.size(), std::memory_order_relaxed);
    for (Request* r : batch) Finish(*r);
    return;
  }
  if (batch.size() == 1 && !group.compress) {
    // Alone: reduce in the caller's memory, no copy (in place when in and out are one array).
    Request& r = *batch[0];
    timeline::Span span("allreduce", "collectives",
                        timeline::Enabled()
                            ? timeline::Args().Str("name", r.name).Int("bytes", r.in.nbytes())
                            : timeline::Args());
    backend->Allreduce(r.in.data(), r.out.data(), static_cast<size_t>(r.in.size()), r.desc.dtype,
                       r.desc.op);
    Finish(r);
    return;
  }
  if (!group.compress && group.op != ReduceOp::kAdasum) {
    // The backend reaches each tensor where it lies (one host's shared memory: one copy in and
    // one out, where a fusion buffer costs two more), or fuses them in `fusion` itself.
    std::vector<AllreducePiece> pieces;
    pieces.reserve(batch.size());
    size_t bytes = 0;
    for (const Request* r : batch) {
      pieces.push_back(
          AllreducePiece{r->in.data(), r->out.data(), static_cast<size_t>(r->in.size())});
      bytes += r->in.nbytes();
    }
    {
      timeline::Span span("allreduce", "collectives",
                          timeline::Enabled()
                              ? timeline::Args().Int("tensors", batch.size()).Int("bytes", bytes)
                              : timeline::Args());
      backend->AllreducePieces(pieces, group.wire, group.op, fusion);
    }
    if (batch.size() > 1) fused_tensors.fetch_add(batch.size(), std::memory_order_relaxed);
    for (Request* r : batch) Finish(*r);
    return;
  }
  const size_t wire_size = DTypeSize(group.wire);
  size_t total = 0;
  for (const Request* r : batch) total += static_cast<size_t>(r->in.size());
  if (fusion.size() < total * wire_size) fusion.resize(total * wire_size);
  size_t offset = 0;
  std::optional<timeline::Span> copy_in;
  copy_in.emplace("fusion_copy", "collectives",
                  timeline::Enabled() ? timeline::Args().Int("tensors", batch.size()).Int("into", 1)
                                      : timeline::Args());
  for (const Request* r : batch) {
    const size_t n = static_cast<size_t>(r->in.size());
    char* slot = fusion.data() + offset * wire_size;
    if (group.compress) {
      FloatToHalf(static_cast<const float*>(r->in.data()), reinterpret_cast<uint16_t*>(slot), n);
    } else if (n > 0) {
      std::memcpy(slot, r->in.data(), n * wire_size);
    }
    offset += n;
  }
  copy_in.reset();
  {
    // Compressed sums are averaged after widening back to float32: float16 has no room to spare.
    timeline::Span span(
        "allreduce", "collectives",
        timeline::Enabled()
            ? timeline::Args().Int("tensors", batch.size()).Int("bytes", total * wire_size)
            : timeline::Args());
    if (group.op == ReduceOp::kAdasum) {
      // Each tensor its own dot product and norms (adasum.h), so the engine says where each is.
      std::vector<size_t> counts;
      for (const Request* r : batch) counts.push_back(static_cast<size_t>(r->in.size()));
      backend->Adasum(fusion.data(), fusion.data(), counts, group.wire);
    } else {
      backend->Allreduce(fusion.data(), fusion.data(), total, group.wire,
                         group.compress ? ReduceOp::kSum : group.op);
    }
  }
  timeline::Span copy_out("fusion_copy", "collectives",
                          timeline::Enabled()
                              ? timeline::Args().Int("tensors", batch.size()).Int("into", 0)
                              : timeline::Args());
  offset = 0;
  for (Request* r : batch) {
    const size_t n = static_cast<size_t>(r->in.size());
    const char* slot = fusion.data() + offset * wire_size;
    if (group.compress) {
      HalfToFloat(reinterpret_cast<const uint16_t*>(slot), static_cast<float*>(r->out.data()), n);
      if (group.op == ReduceOp::kAverage) Scale(r->out.data(), n, DType::kFloat32, 1.0 / size);
    } else if (n > 0) {
      std::memcpy(r->out.data(), slot, n * wire_size);
    }
    offset += n;
  }
  if (batch.size() > 1) fused_tensors.fetch_add(batch.size(), std::memory_order_relaxed);
  for (Request* r : batch) Finish(*r);
}

void Engine::Impl::RunAllgather(Request& r, const ReadyCollective& c) {
  const size_t row_bytes = RowBytes(r.desc);
  std::vector<size_t> bytes(size);
  Shape shape = r.desc.shape;
  shape[0] = 0;
  for (int i = 0; i < size; ++i) {
    shape[0] += c.descriptors[i].shape[0];
    bytes[i] = static_cast<size_t>(c.descriptors[i].shape[0]) * row_bytes;
  }
  const size_t total = static_cast<size_t>(NumElements(shape)) * DTypeSize(r.desc.dtype);
  if (r.desc.on_device) {
    Array result;
    {
      timeline::Span span("nccl_allgather", "collectives",
                          timeline::Enabled()
                              ? timeline::Args().Str("name", r.name).Int("bytes", total)
                              : timeline::Args());
      result = Nccl().Allgatherv(r.in, shape, bytes);
    }
    data_calls.fetch_add(1, std::memory_order_relaxed);
    Finish(r, nullptr, std::move(result));
    return;
  }
  Array result = NewHostArray(shape, r.desc.dtype);
  {
    timeline::Span span("allgather", "collectives",
                        timeline::Enabled()
                            ? timeline::Args().Str("name", r.name).Int("bytes", total)
                            : timeline::Args());
    backend->Allgatherv(r.in.data(), result.data(), bytes);
  }
  data_calls.fetch_add(1, std::memory_order_relaxed);
  Finish(r, nullptr, std::move(result));
}

void Engine::Impl::RunBroadcast(Request& r) {
  {
    timeline::Span span(r.desc.on_device ? "nccl_broadcast" : "broadcast", "collectives",
                        timeline::Enabled()
                            ? timeline::Args().Str("name", r.name).Int("bytes", r.out.nbytes())
                            : timeline::Args());
    if (r.desc.on_device) {
      Nccl().Broadcast(r.out, r.desc.root);
    } else {
      backend->Broadcast(r.out.data(), r.out.nbytes(), r.desc.root);
    }
  }
  data_calls.fetch_add(1, std::memory_order_relaxed);
  Finish(r);
}

void Engine::Impl::RunAlltoall(Request& r, const ReadyCollective& c) {
  const size_t row_bytes = RowBytes(r.desc);
  std::vector<size_t> send_bytes(size), recv_bytes(size);
  std::vector<int64_t> received(size);
  Shape shape = r.desc.shape;
  shape[0] = 0;
  for (int i = 0; i < size; ++i) {
    send_bytes[i] = static_cast<size_t>(r.desc.splits[i]) * row_bytes;
    received[i] = c.descriptors[i].splits[rank];  // the negotiation checked every rank's splits
    recv_bytes[i] = static_cast<size_t>(received[i]) * row_bytes;
    shape[0] += received[i];
  }
  Array result = NewHostArray(shape, r.desc.dtype);
  {
    timeline::Span span("alltoall", "collectives",
                        timeline::Enabled()
                            ? timeline::Args().Str("name", r.name).Int("bytes", r.in.nbytes())
                            : timeline::Args());
    backend->Alltoallv(r.in.data(), send_bytes, result.data(), recv_bytes);
  }
  data_calls.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(r.state->mutex);
    r.state->received_rows = std::move(received);
  }
  Finish(r, nullptr, std::move(result));
}

void Engine::Impl::RunReducescatter(Request& r) {
  // The whole tensor is reduced, and this rank keeps its rows (ReducescatterRows). Over shared
  // memory that is what a reduce-scatter costs anyway; across hosts it moves up to twice the
  // bytes of a ring reduce-scatter.
  const auto [first, rows] = ReducescatterRows(r.desc.shape[0], size, rank);
  Array reduced = NewHostArray(r.desc.shape, r.desc.dtype);
  {
    timeline::Span span("reducescatter", "collectives",
                        timeline::Enabled()
                            ? timeline::Args().Str("name", r.name).Int("bytes", r.in.nbytes())
                            : timeline::Args());
    backend->Allreduce(r.in.data(), reduced.data(), static_cast<size_t>(r.in.size()), r.desc.dtype,
                       r.desc.op);
  }
  data_calls.fetch_add(1, std::memory_order_relaxed);
  Shape shape = r.desc.shape;
  shape[0] = rows;
  const size_t row_bytes = RowBytes(r.desc);
  Array mine = NewHostArray(shape, r.desc.dtype);
  if (rows > 0) {
    std::memcpy(mine.data(), static_cast<const char*>(reduced.data()) + first * row_bytes,
                static_cast<size_t>(rows) * row_bytes);
  }
  Finish(r, nullptr, std::move(mine));
}

Array Engine::Impl::StandIn(const Descriptor& d) {
  const Reduction how = ReductionOf(d.op);
  if (d.on_device) return Nccl().Identity(d.shape, d.dtype, how);
  Array a(d.shape, d.dtype);
  FillIdentity(a.data(), static_cast<size_t>(a.size()), d.dtype, how);
  return a;
}

}  // namespace dtrain::collectives

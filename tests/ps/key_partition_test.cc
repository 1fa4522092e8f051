// KeyPartition: every worker must compute the same slots, the slots must cover each key exactly
// once, no slot may exceed DTRAIN_CHUNK_BYTES, and servers must get even shares of the bytes.
#include "ps/key_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "compression/codec.h"
#include "dtrain/common/error.h"

namespace dtrain::ps {
namespace {

// Checks the invariants of one key's slots; returns the elements per server.
std::vector<int64_t> CheckSlots(const std::vector<Slot>& slots, int64_t elements, DType dtype,
                                int num_servers, size_t chunk_bytes) {
  std::vector<int64_t> per_server(num_servers, 0);
  EXPECT_FALSE(slots.empty());
  int64_t next = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    EXPECT_EQ(s.part, i) << "parts are numbered in order of offset";
    EXPECT_EQ(s.offset, next) << "slot " << i << " leaves a gap or overlaps";
    EXPECT_GE(s.length, 0);
    EXPECT_GE(s.server, 0);
    EXPECT_LT(s.server, num_servers);
    EXPECT_LE(static_cast<size_t>(s.length) * DTypeSize(dtype), chunk_bytes)
        << "slot " << i << " of a key of " << elements << " elements";
    if (s.server >= 0 && s.server < num_servers) per_server[s.server] += s.length;
    next = s.offset + s.length;
  }
  EXPECT_EQ(next, elements) << "slots do not end at the key's end";
  return per_server;
}

TEST(KeyPartition, SmallKeysGoWholeToTheServerWithFewestBytes) {
  KeyPartition p(3, /*bigarray_bound=*/1000, /*chunk_bytes=*/1 << 20);
  // Sizes in elements; each key lands on the least loaded server (ties: the lowest rank).
  const std::vector<std::pair<int64_t, int>> keys = {{100, 0}, {10, 1}, {10, 2}, {50, 1}, {50, 2},
                                                     {999, 1}, {1, 2},  {1, 2},  {200, 2}};
  uint64_t key = 0;
  for (auto [size, server] : keys) {
    const auto& slots = p.Add(key, size, DType::kFloat32);
    ASSERT_EQ(slots.size(), 1u) << "key " << key;
    EXPECT_EQ(slots[0].server, server) << "key " << key << " of " << size << " elements";
    ++key;
  }
  EXPECT_EQ(p.bytes_per_server(), (std::vector<uint64_t>{400, 4236, 1048}));
}

TEST(KeyPartition, ManySmallKeysAreBalancedByBytes) {
  std::mt19937 rng(42);
  for (int servers : {2, 3, 5, 8}) {
    KeyPartition p(servers, 100000, 1 << 20);
    int64_t largest = 0;
    for (uint64_t key = 0; key < 500; ++key) {
      const int64_t size = 1 + static_cast<int64_t>(rng() % 5000);
      largest = std::max(largest, size);
      p.Add(key, size, DType::kFloat32);
    }
    const auto& bytes = p.bytes_per_server();
    const auto [lo, hi] = std::minmax_element(bytes.begin(), bytes.end());
    // Greedy placement keeps servers within one key of each other.
    EXPECT_LE(*hi - *lo, static_cast<uint64_t>(largest) * 4) << servers << " servers";
  }
}

TEST(KeyPartition, BigKeysAreSplitEvenlyOverEveryServer) {
  for (int servers : {2, 3, 4, 7}) {
    for (int64_t size : {int64_t{1000}, int64_t{1001}, int64_t{4099}, int64_t{123457}}) {
      KeyPartition p(servers, /*bigarray_bound=*/1000, /*chunk_bytes=*/4096);
      const auto& slots = p.Add(1, size, DType::kFloat32);
      auto per_server = CheckSlots(slots, size, DType::kFloat32, servers, 4096);
      const auto [lo, hi] = std::minmax_element(per_server.begin(), per_server.end());
      // Ranges are cut at multiples of 32 elements (whole words of compressed values).
      EXPECT_LE(*hi - *lo, kCompressionAlignment) << size << " elements over " << servers;
      EXPECT_GT(*lo, 0) << "every server gets a share";
      // Each server's range is contiguous and ranges come in server order.
      for (size_t i = 1; i < slots.size(); ++i) {
        EXPECT_GE(slots[i].server, slots[i - 1].server);
      }
      EXPECT_EQ(
          std::accumulate(p.bytes_per_server().begin(), p.bytes_per_server().end(), uint64_t{0}),
          static_cast<uint64_t>(size) * 4);
    }
  }
}

TEST(KeyPartition, ChunksNeverExceedChunkBytesAndAreEven) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16}) {
    for (size_t chunk : {size_t{256}, size_t{1000}, size_t{1024}, size_t{4096}}) {
      for (int64_t size : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257},
                           int64_t{999}, int64_t{10007}}) {
        KeyPartition p(2, /*bigarray_bound=*/1000, chunk);
        const auto& slots = p.Add(5, size, dtype);
        CheckSlots(slots, size, dtype, 2, chunk);
        // The pieces of one server's range differ by at most one word of compressed values.
        for (int s = 0; s < 2; ++s) {
          int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
          for (const Slot& slot : slots) {
            if (slot.server != s) continue;
            lo = std::min(lo, slot.length);
            hi = std::max(hi, slot.length);
          }
          if (hi > 0) {
            EXPECT_LE(hi - lo, kCompressionAlignment) << size << " elements, " << chunk;
          }
        }
      }
    }
  }
}

TEST(KeyPartition, AnEmptyKeyHasOneEmptySlot) {
  KeyPartition p(2, 1000, 1024);
  const auto& slots = p.Add(1, 0, DType::kFloat32);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0].length, 0);
}

TEST(KeyPartition, OneServerTakesBigKeysWholeInChunks) {
  KeyPartition p(1, 1000, 1024);
  const auto& slots = p.Add(1, 5000, DType::kFloat32);
  CheckSlots(slots, 5000, DType::kFloat32, 1, 1024);
  EXPECT_EQ(slots.size(), 20u);  // 5000 floats in pieces of at most 256
}

TEST(KeyPartition, IdenticalCallsGiveIdenticalPlacements) {
  std::mt19937 rng(7);
  std::vector<std::pair<int64_t, DType>> calls;
  for (int i = 0; i < 300; ++i) {
    calls.push_back(
        {static_cast<int64_t>(rng() % 20000), i % 3 == 0 ? DType::kFloat64 : DType::kFloat32});
  }
  KeyPartition a(3, 5000, 4096);
  KeyPartition b(3, 5000, 4096);
  for (size_t k = 0; k < calls.size(); ++k) {
    const auto& sa = a.Add(k * 11, calls[k].first, calls[k].second);
    const auto& sb = b.Add(k * 11, calls[k].first, calls[k].second);
    ASSERT_EQ(sa.size(), sb.size()) << "key " << k;
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].server, sb[i].server);
      EXPECT_EQ(sa[i].part, sb[i].part);
      EXPECT_EQ(sa[i].offset, sb[i].offset);
      EXPECT_EQ(sa[i].length, sb[i].length);
    }
    CheckSlots(sa, calls[k].first, calls[k].second, 3, 4096);
  }
  EXPECT_EQ(a.bytes_per_server(), b.bytes_per_server());
}

TEST(KeyPartition, FindReturnsWhatAddPlaced) {
  KeyPartition p(2, 1000, 1024);
  EXPECT_EQ(p.Find(3), nullptr);
  const std::vector<Slot> added = p.Add(3, 3000, DType::kFloat32);
  const auto* found = p.Find(3);
  ASSERT_NE(found, nullptr);
  ASSERT_EQ(found->size(), added.size());
  EXPECT_EQ(found->back().offset + found->back().length, 3000);
}

TEST(KeyPartition, AddingAKeyTwiceThrowsAndChangesNothing) {
  KeyPartition p(2, 1000, 1024);
  p.Add(3, 10, DType::kFloat32);
  const auto bytes = p.bytes_per_server();
  EXPECT_THROW(p.Add(3, 10, DType::kFloat32), InvalidArgument);
  EXPECT_THROW(p.Add(3, 5000, DType::kFloat64), InvalidArgument);
  EXPECT_EQ(p.bytes_per_server(), bytes);
  EXPECT_EQ(p.Find(3)->size(), 1u);
}

TEST(KeyPartition, KeysOverThePartitionBytesAreSplitOverTheLeastLoadedServers) {
  // 3 servers, bound 1,000,000 elements, parts of at most 4,096 bytes (1,024 floats).
  KeyPartition p(3, 1000000, /*chunk_bytes=*/1 << 20, /*partition_bytes=*/4096);
  EXPECT_EQ(p.Add(0, 1024, DType::kFloat32).size(), 1u);  // exactly one part: whole
  EXPECT_EQ(p.bytes_per_server(), (std::vector<uint64_t>{4096, 0, 0}));
  EXPECT_EQ(p.Add(5, 8, DType::kFloat32)[0].server, 1);
  const auto& slots = p.Add(1, 3000, DType::kFloat32);  // 12,000 bytes: 3 parts
  CheckSlots(slots, 3000, DType::kFloat32, 3, 4096 + kCompressionAlignment * 4);
  ASSERT_EQ(slots.size(), 3u);
  // One part (992, 992, 1,016 elements) per server, the least loaded first: 2 (empty), 1 (32
  // bytes), then 0, although 2 has fewer bytes by then: a part on every server.
  EXPECT_EQ(slots[0].server, 2);
  EXPECT_EQ(slots[1].server, 1);
  EXPECT_EQ(slots[2].server, 0);
  for (const Slot& slot : slots) EXPECT_EQ(slot.offset % kCompressionAlignment, 0);
  // Just over the partition size: still one part per server. Far over it: parts of at most that
  // size, every server holding one before any holds two.
  EXPECT_EQ(p.Add(2, 1040, DType::kFloat32).size(), 3u);
  const auto& many = p.Add(3, 7 * 1024, DType::kFloat32);
  ASSERT_EQ(many.size(), 7u);
  std::vector<int> parts_on(3, 0);
  for (size_t i = 0; i < many.size(); ++i) {
    ++parts_on[many[i].server];
    if (i == 2 || i == 5) {
      EXPECT_EQ(parts_on, std::vector<int>(3, static_cast<int>(i + 1) / 3));
    }
  }
}

TEST(KeyPartition, PartitioningEvensOutServersWhenKeysAreLargeAgainstTheirShare) {
  // Many small keys and a few of up to 2.4 MB, over 8 servers (a share is 1.2 MB). Whole keys leave
  // one server with twice its share; parts of a fifth of a share keep every server close to it.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 40; ++i) sizes.push_back(64 + 256 * (i % 7));
  for (int64_t big : {589824, 2359296, 1048576, 524288, 2359296, 262144, 2048000, 147456}) {
    sizes.push_back(big / 4);  // elements of float32 tensors of those bytes
  }
  auto imbalance = [&](size_t partition_bytes) {
    KeyPartition p(8, 1000000, 4 << 20, partition_bytes);
    for (size_t k = 0; k < sizes.size(); ++k) p.Add(k, sizes[k], DType::kFloat32);
    const auto& bytes = p.bytes_per_server();
    const double total = std::accumulate(bytes.begin(), bytes.end(), 0.0);
    return static_cast<double>(*std::max_element(bytes.begin(), bytes.end())) / (total / 8);
  };
  EXPECT_GT(imbalance(0), 1.9);
  EXPECT_LT(imbalance(256 << 10), 1.15);
}

TEST(KeyPartition, AJobWithoutServersIsRefused) {
  EXPECT_THROW(KeyPartition(0, 1000, 1024), InvalidArgument);
  EXPECT_THROW(KeyPartition(-1, 1000, 1024), InvalidArgument);
  EXPECT_THROW(KeyPartition(2, 1000, 128), InvalidArgument);  // not 32 float64 elements
  EXPECT_THROW(KeyPartition(2, 1000, 1024, 128), InvalidArgument);
}

TEST(KeyPartition, BoundariesFallOnWholeWordsOfCompressedValues) {
  for (int servers : {1, 2, 3}) {
    for (int64_t size : {int64_t{1000}, int64_t{4099}, int64_t{100003}}) {
      KeyPartition p(servers, /*bigarray_bound=*/1000, /*chunk_bytes=*/4000);
      const auto& slots = p.Add(1, size, DType::kFloat32);
      CheckSlots(slots, size, DType::kFloat32, servers, 4000);
      for (const Slot& slot : slots) EXPECT_EQ(slot.offset % kCompressionAlignment, 0);
    }
  }
}

}  // namespace
}  // namespace dtrain::ps

// ShmGroup on its own: ranks are threads of this process, each with its own mapping of a real
// segment in /dev/shm, exactly as separate processes would map it. Small slots force operations
// over many rounds. (Processes that die are covered by jobs_test.cc, through the gloo backend.)
#include "collectives/gloo/shm_group.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <future>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

ShmGroupOptions Options(int rank, int size, size_t slot_bytes = 4096,
                        Duration timeout = Duration(20000)) {
  ShmGroupOptions options;
  options.rank = rank;
  options.size = size;
  options.slot_bytes = slot_bytes;
  options.timeout = timeout;
  return options;
}

// One group of `size` ranks; Run gives each rank's body its group, on its own thread.
struct Group {
  explicit Group(int size, size_t slot_bytes = 4096, Duration timeout = Duration(20000)) {
    ranks.push_back(ShmGroup::Create(Options(0, size, slot_bytes, timeout)));
    for (int r = 1; r < size; ++r) {
      ranks.push_back(ShmGroup::Attach(ranks[0]->name(), Options(r, size, slot_bytes, timeout)));
    }
    ranks[0]->Unlink();
  }

  // Rethrows the first rank's exception, after every rank has finished.
  void Run(const std::function<void(int rank, ShmGroup&)>& body) {
    std::vector<std::future<void>> done;
    for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
      done.push_back(std::async(std::launch::async, [&, r] { body(r, *ranks[r]); }));
    }
    for (auto& d : done) d.wait();
    for (auto& d : done) d.get();
  }

  std::vector<std::unique_ptr<ShmGroup>> ranks;
};

TEST(ShmGroup, AllreduceIsExactOverManyRoundsForEveryRankCount) {
  for (int size : {2, 3, 5}) {
    Group group(size);
    // 10,007 floats: 10 rounds of 1,024 and a ragged last one; shares not a multiple of the size.
    const size_t count = 10007;
    std::vector<std::vector<float>> out(size, std::vector<float>(count));
    group.Run([&](int rank, ShmGroup& g) {
      std::vector<float> in(count);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((rank + 1) * (i % 97));
      g.Allreduce(in.data(), out[rank].data(), count, DType::kFloat32);
    });
    const float ranks_sum = size * (size + 1) / 2.0f;
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[r][i], ranks_sum * (i % 97))
            << "size " << size << " rank " << r << " i " << i;
      }
    }
  }
}

TEST(ShmGroup, AllreduceInPlaceOfEveryDtype) {
  Group group(3);
  group.Run([&](int rank, ShmGroup& g) {
    std::vector<double> d(3000, rank + 0.5);
    g.Allreduce(d.data(), d.data(), d.size(), DType::kFloat64);
    for (double x : d) ASSERT_EQ(x, 4.5);
    // float16 1.0 is 0x3c00; 1 + 1 + 1 = 3 is 0x4200. bfloat16 1.0 is 0x3f80, 3 is 0x4040.
    std::vector<uint16_t> half(5000, 0x3c00);
    g.Allreduce(half.data(), half.data(), half.size(), DType::kFloat16);
    for (uint16_t x : half) ASSERT_EQ(x, 0x4200);
    std::vector<uint16_t> brain(5000, 0x3f80);
    g.Allreduce(brain.data(), brain.data(), brain.size(), DType::kBFloat16);
    for (uint16_t x : brain) ASSERT_EQ(x, 0x4040);
  });
}

// Pieces of `counts` floats, odd ones in place and even ones into an output, reduced by 3 ranks
// over slots of `slot_bytes` and halved.
void ExpectPiecesReducedAsOneArray(const std::vector<size_t>& counts, size_t slot_bytes) {
  Group group(3, slot_bytes);
  group.Run([&](int rank, ShmGroup& g) {
    std::vector<std::vector<float>> ins, outs;
    std::vector<AllreducePiece> pieces;
    size_t base = 0;
    for (size_t p = 0; p < counts.size(); ++p) {
      ins.emplace_back(counts[p]);
      outs.emplace_back(counts[p], -1.0f);
      for (size_t i = 0; i < counts[p]; ++i) {
        ins[p][i] = static_cast<float>((rank + 1) * ((base + i) % 89));
      }
      base += counts[p];
    }
    for (size_t p = 0; p < counts.size(); ++p) {
      float* out = p % 2 ? ins[p].data() : outs[p].data();
      pieces.push_back(AllreducePiece{ins[p].data(), out, counts[p]});
    }
    g.AllreducePieces(pieces, DType::kFloat32, Reduction::kSum, 0.5);
    base = 0;
    for (size_t p = 0; p < counts.size(); ++p) {
      const std::vector<float>& got = p % 2 ? ins[p] : outs[p];
      for (size_t i = 0; i < counts[p]; ++i) {
        // (1 + 2 + 3) x the value, halved.
        ASSERT_EQ(got[i], 3.0f * ((base + i) % 89)) << "piece " << p << " element " << i;
      }
      base += counts[p];
    }
  });
}

TEST(ShmGroup, PiecesAreReducedAsOneArrayAcrossRoundsAndScaled) {
  // End to end 4,326 floats: the 1,024-float rounds cut through pieces, and a piece through
  // rounds.
  ExpectPiecesReducedAsOneArray({0, 1, 1500, 0, 2048, 777}, 4096);
}

TEST(ShmGroup, SharesLargerThanASumBlockAreSummedBlockByBlockAcrossPieces) {
  // One round of 140,002 floats: each rank's share (about 182 KB) spans pieces and is summed in
  // blocks of 32 KB, the third rank's kept aside from the output it overwrites.
  ExpectPiecesReducedAsOneArray({40000, 1, 70001, 0, 30000}, size_t{1} << 20);
}

TEST(ShmGroup, EveryRankGetsTheSameBitsThoughFloatAdditionIsNotAssociative) {
  Group group(4);
  const size_t count = 4096;
  std::vector<std::vector<float>> out(4, std::vector<float>(count));
  group.Run([&](int rank, ShmGroup& g) {
    std::vector<float> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = 1.0f / static_cast<float>(1 + i + 7 * rank);
    g.Allreduce(in.data(), out[rank].data(), count, DType::kFloat32);
  });
  for (int r = 1; r < 4; ++r) EXPECT_EQ(out[r], out[0]) << "rank " << r;
}

TEST(ShmGroup, AllgathervOfUnevenAndEmptyContributions) {
  Group group(3);
  // 9,000 bytes (three rounds of 4,096), nothing, 5 bytes.
  const std::vector<size_t> bytes = {9000, 0, 5};
  const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  std::vector<std::vector<char>> out(3, std::vector<char>(total));
  group.Run([&](int rank, ShmGroup& g) {
    std::vector<char> in(bytes[rank]);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(rank * 50 + i % 50);
    g.Allgatherv(in.data(), out[rank].data(), bytes);
  });
  std::vector<char> expected;
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < bytes[r]; ++i) expected.push_back(static_cast<char>(r * 50 + i % 50));
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r], expected) << "rank " << r;
}

TEST(ShmGroup, AlltoallvOfUnevenAndEmptyBlocksOverManyRounds) {
  Group group(3);
  // Rank s sends sizes[s][d] bytes to rank d: some blocks need several rounds of a 4,096-byte
  // slot's share, some are empty, and a rank's block to itself goes straight across.
  const size_t sizes[3][3] = {{10, 5000, 0}, {0, 7, 3000}, {2500, 1, 0}};
  auto byte = [](int from, int to, size_t i) {
    return static_cast<char>(from * 70 + to * 20 + i % 17);
  };
  std::vector<std::vector<char>> out(3);
  group.Run([&](int rank, ShmGroup& g) {
    std::vector<size_t> send(3), recv(3);
    std::vector<char> in;
    for (int d = 0; d < 3; ++d) {
      send[d] = sizes[rank][d];
      recv[d] = sizes[d][rank];
      for (size_t i = 0; i < send[d]; ++i) in.push_back(byte(rank, d, i));
    }
    out[rank].resize(std::accumulate(recv.begin(), recv.end(), size_t{0}));
    g.Alltoallv(in.data(), send, out[rank].data(), recv);
    g.Barrier();  // still in step after it
  });
  for (int r = 0; r < 3; ++r) {
    std::vector<char> expected;
    for (int s = 0; s < 3; ++s) {
      for (size_t i = 0; i < sizes[s][r]; ++i) expected.push_back(byte(s, r, i));
    }
    EXPECT_EQ(out[r], expected) << "rank " << r;
  }
}

TEST(ShmGroup, BroadcastFromEveryRootAndBarriersBetween) {
  Group group(3);
  group.Run([&](int rank, ShmGroup& g) {
    for (int root = 0; root < 3; ++root) {
      std::vector<int32_t> data(3000, rank == root ? root * 1000 + 7 : -1);
      g.Broadcast(data.data(), data.size() * sizeof(int32_t), root);
      for (int32_t x : data) ASSERT_EQ(x, root * 1000 + 7);
      g.Barrier();
    }
  });
}

TEST(ShmGroup, ManySmallCallsKeepTheRanksInStep) {
  Group group(2, 64 << 10);
  group.Run([&](int rank, ShmGroup& g) {
    for (int i = 0; i < 2000; ++i) {
      float x = static_cast<float>(rank + i);
      g.Allreduce(&x, &x, 1, DType::kFloat32);
      ASSERT_EQ(x, static_cast<float>(1 + 2 * i));
    }
  });
}

TEST(ShmGroup, AWaitForARankThatNeverComesTimesOutNamingIt) {
  Group group(2, 4096, Duration(300));
  group.ranks[0] = nullptr;  // rank 0 leaves its mapping; its process (this one) lives on
  try {
    group.ranks[1]->Barrier();
    FAIL() << "the barrier passed without rank 0";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("DTRAIN_COLLECTIVE_TIMEOUT_MS"), std::string::npos)
        << e.what();
  }
}

TEST(ShmGroup, AbandoningFailsTheWaitingRanksAtOnceWithTheReason) {
  Group group(3);
  auto waiting = std::async(std::launch::async, [&] {
    std::vector<float> x(100, 1.0f);
    group.ranks[1]->Allreduce(x.data(), x.data(), x.size(), DType::kFloat32);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group.ranks[2]->Abandon("its disk caught fire");
  try {
    waiting.get();
    FAIL() << "the allreduce passed without ranks 0 and 2";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("its disk caught fire"), std::string::npos) << e.what();
  }
  // A rank arriving later fails the same way instead of waiting.
  EXPECT_THROW(group.ranks[0]->Barrier(), PeerError);
}

TEST(ShmGroup, AttachRefusesAWrongSizeATakenRankAndAMissingName) {
  auto creator = ShmGroup::Create(Options(0, 2));
  EXPECT_THROW(ShmGroup::Attach(creator->name(), Options(1, 3)), Error);
  EXPECT_THROW(ShmGroup::Attach(creator->name(), Options(0, 2)), Error);  // rank 0 is taken
  EXPECT_THROW(ShmGroup::Attach(creator->name(), Options(2, 2)), Error);  // no rank 2 of 2
  auto second = ShmGroup::Attach(creator->name(), Options(1, 2));
  EXPECT_THROW(ShmGroup::Attach(creator->name(), Options(1, 2)), Error);
  EXPECT_THROW(ShmGroup::Attach("/dtrain-collectives-no-such-segment", Options(1, 2)), Error);
}

TEST(ShmGroup, NothingIsLeftInDevShmOnceUnlinkedOrDestroyed) {
  std::string name;
  {
    auto creator = ShmGroup::Create(Options(0, 2));
    name = creator->name();
    auto other = ShmGroup::Attach(name, Options(1, 2));
    creator->Unlink();
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    EXPECT_LT(fd, 0) << name << " is still there after Unlink";
  }
  {
    auto creator = ShmGroup::Create(Options(0, 2));
    name = creator->name();
  }
  EXPECT_LT(shm_open(name.c_str(), O_RDONLY, 0), 0) << name << " outlived its creator";
}

TEST(ShmGroup, ACreatorKilledBeforeUnlinkingLeavesNothingOnceTheOthersEnd) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the creator: announces the name and dies as SIGKILL would leave it
    auto creator = ShmGroup::Create(Options(0, 2));
    const std::string& created = creator->name();
    const bool written =
        write(pipe_fds[1], created.data(), created.size()) == static_cast<ssize_t>(created.size());
    _exit(written ? 0 : 1);  // no destructor runs: the name stays
  }
  close(pipe_fds[1]);
  char buffer[256];
  const ssize_t n = read(pipe_fds[0], buffer, sizeof buffer);
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_GT(n, 0);
  const std::string name(buffer, static_cast<size_t>(n));
  { auto other = ShmGroup::Attach(name, Options(1, 2)); }
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  EXPECT_LT(fd, 0) << name << " outlived every rank";
  if (fd >= 0) {
    close(fd);
    shm_unlink(name.c_str());
  }
}

}  // namespace
}  // namespace dtrain::collectives

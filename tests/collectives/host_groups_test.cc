// HostLayout from host ids, and HostGroups' two-level algorithms with every level real: ranks are
// threads, each host's ranks share a real ShmGroup, and the leaders' channel is one more ShmGroup
// between the leaders (in a job it is gloo over TCP: tests/network/hierarchical_allreduce_test.sh).
#include "collectives/gloo/host_groups.h"

#include <gtest/gtest.h>

#include <future>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace dtrain::collectives {
namespace {

TEST(HostLayout, HostsInTheOrderOfTheirLowestRankWhichLeads) {
  const std::vector<std::string> ids = {"b", "a", "b", "c", "a"};
  const HostLayout layout = HostLayout::FromHostIds(ids, 4);
  ASSERT_EQ(layout.hosts(), 3);
  EXPECT_EQ(layout.host_ranks[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(layout.host_ranks[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(layout.host_ranks[2], (std::vector<int>{3}));
  EXPECT_EQ(layout.host_of_rank, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(layout.my_host, 1);
  EXPECT_EQ(layout.local_rank, 1);
  EXPECT_FALSE(layout.leader());
  EXPECT_TRUE(HostLayout::FromHostIds(ids, 1).leader());
  EXPECT_EQ(HostLayout::FromHostIds({"x", "x", "x"}, 2).hosts(), 1);
  EXPECT_EQ(HostLayout::FromHostIds({"x", "y", "z"}, 2).hosts(), 3);
}

// The leaders' collectives over a ShmGroup of the leaders (its rank = host number).
class ShmLeaders : public LeaderChannel {
 public:
  explicit ShmLeaders(ShmGroup& group) : group_(group) {}
  void LeadersAllreduce(void* data, size_t count, DType dtype, Reduction how) override {
    group_.Allreduce(data, data, count, dtype, how);
  }
  void LeadersAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    group_.Allgatherv(in, out, bytes);
  }
  void LeadersBroadcast(void* data, size_t bytes, int root_host) override {
    group_.Broadcast(data, bytes, root_host);
  }
  void LeadersBarrier() override { group_.Barrier(); }

 private:
  ShmGroup& group_;
};

ShmGroupOptions Options(int rank, int size) {
  ShmGroupOptions options;
  options.rank = rank;
  options.size = size;
  options.slot_bytes = 4096;  // many rounds
  options.timeout = Duration(20000);
  return options;
}

// Every rank's HostGroups for hosts given as each rank's host id.
struct Job {
  explicit Job(const std::vector<std::string>& ids) {
    const int size = static_cast<int>(ids.size());
    const HostLayout any = HostLayout::FromHostIds(ids, 0);
    std::vector<std::vector<std::unique_ptr<ShmGroup>>> locals(any.hosts());
    for (int h = 0; h < any.hosts(); ++h) {
      const int n = static_cast<int>(any.host_ranks[h].size());
      if (n == 1) continue;
      locals[h].push_back(ShmGroup::Create(Options(0, n)));
      for (int l = 1; l < n; ++l) {
        locals[h].push_back(ShmGroup::Attach(locals[h][0]->name(), Options(l, n)));
      }
    }
    leader_groups.push_back(ShmGroup::Create(Options(0, any.hosts())));
    for (int h = 1; h < any.hosts(); ++h) {
      leader_groups.push_back(ShmGroup::Attach(leader_groups[0]->name(), Options(h, any.hosts())));
    }
    for (auto& group : leader_groups) channels.push_back(std::make_unique<ShmLeaders>(*group));
    for (int r = 0; r < size; ++r) {
      HostLayout layout = HostLayout::FromHostIds(ids, r);
      auto local = locals[layout.my_host].empty()
                       ? nullptr
                       : std::move(locals[layout.my_host][layout.local_rank]);
      LeaderChannel* channel = layout.leader() ? channels[layout.my_host].get() : nullptr;
      ranks.push_back(std::make_unique<HostGroups>(std::move(layout), std::move(local), channel));
    }
  }

  void Run(const std::function<void(int rank, HostGroups&)>& body) {
    std::vector<std::future<void>> done;
    for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
      done.push_back(std::async(std::launch::async, [&, r] { body(r, *ranks[r]); }));
    }
    for (auto& d : done) d.get();
  }

  std::vector<std::unique_ptr<ShmGroup>> leader_groups;
  std::vector<std::unique_ptr<ShmLeaders>> channels;
  std::vector<std::unique_ptr<HostGroups>> ranks;
};

// Interleaved hosts, one of a single rank: a, b, a, c, b.
const std::vector<std::string> kHosts = {"a", "b", "a", "c", "b"};

TEST(HostGroups, AllreduceSumsOverEveryHost) {
  Job job(kHosts);
  job.Run([](int rank, HostGroups& g) {
    std::vector<float> x(5000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((rank + 1) * (i % 13));
    g.Allreduce(x.data(), x.data(), x.size(), DType::kFloat32, Reduction::kSum);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], 15.0f * (i % 13)) << "rank " << rank;
  });
}

TEST(HostGroups, MinMaxAndProductReduceOverEveryHost) {
  Job job(kHosts);
  job.Run([](int rank, HostGroups& g) {
    // Rank r holds r + 1 - 2 * (i % 3): every rank's value wins somewhere.
    std::vector<double> values(999);
    for (size_t i = 0; i < values.size(); ++i) values[i] = rank + 1.0 - 2.0 * (i % 3);
    std::vector<double> x = values;
    g.Allreduce(x.data(), x.data(), x.size(), DType::kFloat64, Reduction::kMax);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], 5.0 - 2.0 * (i % 3)) << "rank " << rank;
    x = values;
    g.Allreduce(x.data(), x.data(), x.size(), DType::kFloat64, Reduction::kMin);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], 1.0 - 2.0 * (i % 3)) << "rank " << rank;
    x = values;
    g.Allreduce(x.data(), x.data(), x.size(), DType::kFloat64, Reduction::kProduct);
    for (size_t i = 0; i < x.size(); ++i) {
      double product = 1;
      for (int r = 0; r < 5; ++r) product *= r + 1.0 - 2.0 * (i % 3);
      ASSERT_EQ(x[i], product) << "rank " << rank;
    }
  });
}

TEST(HostGroups, AllgathervComesBackInRankOrder) {
  Job job(kHosts);
  const std::vector<size_t> bytes = {3, 5000, 0, 7, 4100};
  const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  std::vector<char> expected;
  for (int r = 0; r < 5; ++r) {
    for (size_t i = 0; i < bytes[r]; ++i) expected.push_back(static_cast<char>('A' + r + i % 7));
  }
  job.Run([&](int rank, HostGroups& g) {
    std::vector<char> in(bytes[rank]);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>('A' + rank + i % 7);
    std::vector<char> out(total);
    g.Allgatherv(in.data(), out.data(), bytes);
    ASSERT_EQ(out, expected) << "rank " << rank;
  });
}

TEST(HostGroups, BroadcastFromEveryRootThenABarrier) {
  Job job(kHosts);
  job.Run([](int rank, HostGroups& g) {
    for (int root = 0; root < 5; ++root) {
      std::vector<int> data(3000, rank == root ? 100 + root : -1);
      g.Broadcast(data.data(), data.size() * sizeof(int), root);
      for (int x : data) ASSERT_EQ(x, 100 + root) << "rank " << rank << " root " << root;
      g.Barrier();
    }
  });
}

}  // namespace
}  // namespace dtrain::collectives

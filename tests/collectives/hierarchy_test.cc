// The plan of the hierarchical NCCL allreduce (nccl/hierarchy.h): pure, so tables suffice.
#include "collectives/nccl/hierarchy.h"

#include <gtest/gtest.h>

namespace dtrain::collectives {
namespace {

NcclHierarchy PlanOf(const std::vector<std::string>& host_ids, int rank) {
  std::string why;
  auto plan = PlanHierarchy(host_ids, rank, &why);
  EXPECT_TRUE(plan.has_value()) << why;
  // A plan of one host of one rank when there is none, so that a failed test reads no further.
  return plan.value_or(NcclHierarchy{HostLayout::FromHostIds({"?"}, 0), {0}});
}

TEST(NcclHierarchy, ContiguousHostsPairTheRanksOfEachLocalIndex) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b", "c", "c"};
  const NcclHierarchy p3 = PlanOf(hosts, 3);
  EXPECT_EQ(p3.layout.mine(), (std::vector<int>{2, 3}));
  EXPECT_EQ(p3.layout.local_rank, 1);
  EXPECT_EQ(p3.cross_ranks, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(p3.layout.hosts(), 3);
  const NcclHierarchy p4 = PlanOf(hosts, 4);
  EXPECT_EQ(p4.layout.local_rank, 0);
  EXPECT_EQ(p4.cross_ranks, (std::vector<int>{0, 2, 4}));
}

TEST(NcclHierarchy, InterleavedHostsGiveEveryMemberTheSameGroups) {
  // A launcher may deal ranks round-robin over hosts.
  const std::vector<std::string> hosts = {"a", "b", "a", "b"};
  const NcclHierarchy p0 = PlanOf(hosts, 0);
  const NcclHierarchy p1 = PlanOf(hosts, 1);
  const NcclHierarchy p2 = PlanOf(hosts, 2);
  const NcclHierarchy p3 = PlanOf(hosts, 3);
  EXPECT_EQ(p0.layout.host_ranks, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(p3.layout.host_ranks, p0.layout.host_ranks);
  EXPECT_EQ(p0.layout.mine(), (std::vector<int>{0, 2}));
  EXPECT_EQ(p2.layout.mine(), p0.layout.mine());
  EXPECT_EQ(p1.layout.mine(), (std::vector<int>{1, 3}));
  EXPECT_EQ(p0.cross_ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(p1.cross_ranks, p0.cross_ranks);
  EXPECT_EQ(p2.cross_ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(p3.cross_ranks, p2.cross_ranks);
  EXPECT_EQ(p3.layout.local_rank, 1);
}

TEST(NcclHierarchy, OneHostHasNoGroupAcross) {
  const NcclHierarchy p = PlanOf({"a", "a", "a"}, 2);
  EXPECT_EQ(p.layout.mine(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.cross_ranks, (std::vector<int>{2}));
  EXPECT_EQ(p.layout.hosts(), 1);
  const NcclHierarchy alone = PlanOf({"a"}, 0);
  EXPECT_EQ(alone.layout.mine(), (std::vector<int>{0}));
  EXPECT_EQ(alone.cross_ranks, (std::vector<int>{0}));
}

TEST(NcclHierarchy, HostsOfOneRankEachMeetOnlyAcross) {
  const NcclHierarchy p = PlanOf({"a", "b", "c"}, 1);
  EXPECT_EQ(p.layout.mine(), (std::vector<int>{1}));
  EXPECT_EQ(p.layout.local_rank, 0);
  EXPECT_EQ(p.cross_ranks, (std::vector<int>{0, 1, 2}));
}

TEST(NcclHierarchy, UnevenHostsAreRefusedWithTheirCounts) {
  for (int rank = 0; rank < 3; ++rank) {
    std::string why;
    EXPECT_FALSE(PlanHierarchy({"a", "a", "b"}, rank, &why).has_value());
    EXPECT_NE(why.find("different numbers of ranks (2, 1)"), std::string::npos) << why;
  }
}

TEST(NcclHierarchy, ShardsCoverTheBufferWithLessThanOnePerRankOfPadding) {
  struct Case {
    size_t total;
    int local_size;
    size_t shard;
  };
  for (const Case& c : std::vector<Case>{
           {0, 4, 0}, {1, 4, 1}, {4, 4, 1}, {5, 4, 2}, {1000, 1, 1000}, {1001, 8, 126}}) {
    EXPECT_EQ(ShardElements(c.total, c.local_size), c.shard) << c.total << " / " << c.local_size;
    EXPECT_GE(c.shard * c.local_size, c.total);
    EXPECT_LT(c.shard * c.local_size, c.total + c.local_size);
  }
}

}  // namespace
}  // namespace dtrain::collectives

// MemberTable: ids, re-registration by address or rank, erasing, clients.
#include "server/coordinator/member_table.h"

#include "gtest/gtest.h"

namespace recps::server {
namespace {

MemberEntry Entry(v1::MemberRecord record, const std::string& client) {
  return MemberEntry{std::move(record), absl::UnixEpoch(), client};
}

TEST(MemberTable, NewIdsCountPerRoleAndPastLoadedOnes) {
  MemberTable t;
  v1::MemberRecord w = t.NewRecord(v1::WORKER);
  EXPECT_EQ(w.member_id(), "worker-0");
  EXPECT_EQ(w.sequence(), 0);
  w.set_rank(3);
  t.Add(Entry(w, "a"));
  v1::MemberRecord s = t.NewRecord(v1::SHARD_SERVER);
  EXPECT_EQ(s.member_id(), "shard-0");
  EXPECT_EQ(s.sequence(), 1);
  // A member loaded from the state with a high number: new ids pass it.
  v1::MemberRecord loaded;
  loaded.set_member_id("worker-41");
  loaded.set_role(v1::WORKER);
  loaded.set_rank(-1);
  loaded.set_sequence(9);
  t.Add(Entry(loaded, ""));
  EXPECT_EQ(t.NewRecord(v1::WORKER).member_id(), "worker-42");
  EXPECT_EQ(t.NewRecord(v1::WORKER).sequence(), 10);
}

TEST(MemberTable, FindsTheSameMemberByAddressOrRankAndForgetsItOnErase) {
  MemberTable t;
  v1::MemberRecord w = t.NewRecord(v1::WORKER);
  w.set_rank(2);
  t.Add(Entry(w, "a"));
  v1::MemberRecord s = t.NewRecord(v1::SHARD_SERVER);
  s.set_address("h:1");
  t.Add(Entry(s, "b"));
  ASSERT_NE(t.FindSame(v1::WORKER, "", 2), nullptr);
  EXPECT_EQ(t.FindSame(v1::WORKER, "", 2)->record.member_id(), "worker-0");
  EXPECT_EQ(t.FindSame(v1::SHARD_SERVER, "h:1", -1)->record.member_id(), "shard-0");
  EXPECT_EQ(t.FindSame(v1::WORKER, "", -1), nullptr);  // no rank: always new
  EXPECT_EQ(t.OfClient("a"), std::vector<std::string>{"worker-0"});
  t.Erase("worker-0");
  EXPECT_EQ(t.FindSame(v1::WORKER, "", 2), nullptr);
  EXPECT_EQ(t.Find("worker-0"), nullptr);
  EXPECT_TRUE(t.OfClient("a").empty());
  EXPECT_EQ(t.size(), 1u);
}

}  // namespace
}  // namespace recps::server

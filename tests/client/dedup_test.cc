#include "client/dedup.h"

#include <cstdint>
#include <limits>
#include <random>
#include <unordered_map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recps::client {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Reference: first-seen order with a std::unordered_map.
void Reference(const std::vector<int64_t>& ids, std::vector<int64_t>* unique,
               std::vector<int32_t>* inverse) {
  std::unordered_map<int64_t, int32_t> index;
  for (int64_t id : ids) {
    auto [it, inserted] =
        index.emplace(id, static_cast<int32_t>(unique->size()));
    if (inserted) unique->push_back(id);
    inverse->push_back(it->second);
  }
}

TEST(Deduplicate, KeepsFirstSeenOrder) {
  Dedup d;
  const std::vector<int64_t> ids = {7, 3, 7, 0, -1, 3, 3, 9};
  Deduplicate(ids, &d);
  EXPECT_THAT(d.unique, ElementsAre(7, 3, 0, -1, 9));
  EXPECT_THAT(d.inverse, ElementsAre(0, 1, 0, 2, 3, 1, 1, 4));
}

TEST(Deduplicate, EmptyAndExtremeIds) {
  Dedup d;
  Deduplicate({}, &d);
  EXPECT_THAT(d.unique, IsEmpty());
  EXPECT_THAT(d.inverse, IsEmpty());
  const int64_t lo = std::numeric_limits<int64_t>::min();
  const int64_t hi = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> ids = {0, lo, hi, 0, hi, lo};
  Deduplicate(ids, &d);
  EXPECT_THAT(d.unique, ElementsAre(0, lo, hi));
  EXPECT_THAT(d.inverse, ElementsAre(0, 1, 2, 0, 2, 1));
}

TEST(Deduplicate, MatchesReferenceOnRandomInput) {
  std::mt19937_64 rng(42);
  Dedup d;
  for (int size : {1, 15, 16, 17, 1000, 100000}) {
    for (int64_t range : {int64_t{5}, int64_t{1000}, int64_t{1} << 40}) {
      std::vector<int64_t> ids(size);
      for (int64_t& id : ids)
        id = static_cast<int64_t>(rng() % range) - range / 2;
      std::vector<int64_t> unique;
      std::vector<int32_t> inverse;
      Reference(ids, &unique, &inverse);
      Deduplicate(ids, &d);  // reuses d from the previous, larger or not, run
      ASSERT_EQ(d.unique, unique) << size << " " << range;
      ASSERT_EQ(d.inverse, inverse) << size << " " << range;
    }
  }
}

TEST(Deduplicate, ReusesCapacity) {
  Dedup d;
  std::vector<int64_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int64_t>(i % 1000);
  Deduplicate(ids, &d);
  const int64_t* unique_data = d.unique.data();
  const int32_t* inverse_data = d.inverse.data();
  Deduplicate(ids, &d);
  EXPECT_EQ(d.unique.data(), unique_data);
  EXPECT_EQ(d.inverse.data(), inverse_data);
  EXPECT_EQ(d.unique.size(), 1000u);
}

TEST(DeduplicateAppend, ContinuesAcrossLists) {
  Dedup d;
  const std::vector<int64_t> a = {5, 6, 5};
  const std::vector<int64_t> b = {6, 8, 5, 8};
  Deduplicate(a, &d);
  DeduplicateAppend(b, &d);
  EXPECT_THAT(d.unique, ElementsAre(5, 6, 8));
  EXPECT_THAT(d.inverse, ElementsAre(0, 1, 0, 1, 2, 0, 2));

  // Growing past the table's first size rehashes and stays correct.
  std::vector<int64_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  std::vector<int64_t> many(5000);
  for (size_t i = 0; i < many.size(); ++i)
    many[i] = static_cast<int64_t>(i * 7919 % 3001);
  DeduplicateAppend(many, &d);
  all.insert(all.end(), many.begin(), many.end());
  std::vector<int64_t> unique;
  std::vector<int32_t> inverse;
  Reference(all, &unique, &inverse);
  EXPECT_EQ(d.unique, unique);
  EXPECT_EQ(d.inverse, inverse);
}

TEST(DeduplicateAppend, TableGrowsWithDistinctIdsNotWithInput) {
  // Many lists of one table that repeat each other (a feature per list):
  // the table is sized by the 1000 distinct ids, not the 101000 inputs.
  std::mt19937_64 rng(3);
  std::vector<int64_t> base(1000);
  for (int64_t& id : base) id = static_cast<int64_t>(rng());
  Dedup d;
  Deduplicate(base, &d);
  std::vector<int64_t> all = base;
  for (int list = 0; list < 100; ++list) {
    std::vector<int64_t> ids(1000);
    for (int64_t& id : ids) id = base[rng() % base.size()];
    DeduplicateAppend(ids, &d);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  EXPECT_LE(d.table.size(), 4096u);
  std::vector<int64_t> unique;
  std::vector<int32_t> inverse;
  Reference(all, &unique, &inverse);
  EXPECT_EQ(d.unique, unique);
  EXPECT_EQ(d.inverse, inverse);
}

TEST(DeduplicateAppend, OnEmptyDedupActsLikeDeduplicate) {
  Dedup d;
  const std::vector<int64_t> ids = {1, 1, 2};
  DeduplicateAppend(ids, &d);
  EXPECT_THAT(d.unique, ElementsAre(1, 2));
  EXPECT_THAT(d.inverse, ElementsAre(0, 0, 1));
}

}  // namespace
}  // namespace recps::client

namespace recps::client {
namespace {

// Ids deduplicated upstream (the trainer's) are taken without hashing; a
// later append still finds them (the hash table is rebuilt from `unique`).
TEST(AssignDistinct, IdentityInverseAndAppendStillFindsThem) {
  Dedup d;
  Deduplicate(std::vector<int64_t>{9, 9, 9, 9, 9, 9}, &d);  // stale table
  const std::vector<int64_t> ids = {5, -3, 70, 1};
  AssignDistinct(ids, &d);
  EXPECT_THAT(d.unique, ElementsAre(5, -3, 70, 1));
  EXPECT_THAT(d.inverse, ElementsAre(0, 1, 2, 3));
  DeduplicateAppend(std::vector<int64_t>{70, 2, 5, 9}, &d);
  EXPECT_THAT(d.unique, ElementsAre(5, -3, 70, 1, 2, 9));
  EXPECT_THAT(d.inverse, ElementsAre(0, 1, 2, 3, 2, 4, 0, 5));
}

}  // namespace
}  // namespace recps::client

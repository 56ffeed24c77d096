// SlotLoad: ids counted per slot, rates over a window that rotates.
#include "server/shard/slot_load.h"

#include <thread>
#include <vector>

#include "common/hashing.h"
#include "gtest/gtest.h"

namespace recps::server {
namespace {

constexpr uint32_t kSlots = 64;
constexpr uint64_t kKey = 0x1234;

// `n` distinct ids of `slot`.
std::vector<int64_t> IdsOf(uint32_t slot, int n) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; static_cast<int>(ids.size()) < n; ++id) {
    if (SlotOf(kKey, id, kSlots) == slot) ids.push_back(id);
  }
  return ids;
}

TEST(SlotLoadTest, CountsEachIdInItsSlotByKind) {
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  SlotLoad load(kSlots, t0);
  load.Count(SlotLoad::Kind::kLookup, kKey, IdsOf(3, 50));
  load.Count(SlotLoad::Kind::kLookup, kKey, IdsOf(3, 10));
  load.Count(SlotLoad::Kind::kUpdate, kKey, IdsOf(7, 20));
  std::vector<int64_t> mixed = IdsOf(9, 4);
  for (int64_t id : IdsOf(10, 6)) mixed.push_back(id);
  load.Count(SlotLoad::Kind::kLookup, kKey, mixed);
  const SlotLoad::Rates r = load.RatesAt(t0 + absl::Seconds(10));
  EXPECT_DOUBLE_EQ(r.lookup_ids_per_second[3], 6.0);
  EXPECT_DOUBLE_EQ(r.update_ids_per_second[7], 2.0);
  EXPECT_DOUBLE_EQ(r.lookup_ids_per_second[9], 0.4);
  EXPECT_DOUBLE_EQ(r.lookup_ids_per_second[10], 0.6);
  double others = 0;
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (s != 3 && s != 9 && s != 10) others += r.lookup_ids_per_second[s];
    if (s != 7) others += r.update_ids_per_second[s];
  }
  EXPECT_EQ(others, 0);
}

TEST(SlotLoadTest, RatesForgetWhatIsOlderThanTwoWindows) {
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  SlotLoad load(kSlots, t0, absl::Minutes(1));
  load.Count(SlotLoad::Kind::kLookup, kKey, IdsOf(1, 120));  // early traffic
  // 61 s: the first window ends; the counters are kept as they are now.
  EXPECT_NEAR(load.RatesAt(t0 + absl::Seconds(61)).lookup_ids_per_second[1], 120 / 61.0, 1e-9);
  load.Count(SlotLoad::Kind::kLookup, kKey, IdsOf(2, 60));
  // 122 s: rotates again; the rates now start at 61 s, without slot 1.
  const SlotLoad::Rates r = load.RatesAt(t0 + absl::Seconds(122));
  EXPECT_DOUBLE_EQ(r.lookup_ids_per_second[1], 0);
  EXPECT_NEAR(r.lookup_ids_per_second[2], 60 / 61.0, 1e-9);
}

TEST(SlotLoadTest, ThreadsCountingAtOnceLoseNothing) {
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  SlotLoad load(kSlots, t0);
  const std::vector<int64_t> ids = IdsOf(5, 100);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) load.Count(SlotLoad::Kind::kUpdate, kKey, ids);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_DOUBLE_EQ(load.RatesAt(t0 + absl::Seconds(1)).update_ids_per_second[5], 4 * 1000 * 100);
}

}  // namespace
}  // namespace recps::server

// Replication::JoinAsBackup on a server that backs other units of the
// primary already (re-replication onto it): its clock of the primary must
// have applied the step the copy holds before the new units count. The
// primary applies a step while its forwards are on their way, so the clock
// may still wait for that step; a worker's retry of it, forwarded again by
// the new map with the new units' ids, was then added to the pending step
// and applied on rows that held it already (found by the chaos test in
// tests/server/shard/failover_test.cc).
#include "server/shard/replication.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/table_specs.h"
#include "tests/testing/test_store.h"

namespace recps::server {
namespace {

constexpr int kDim = 4;

v1::RequestHeader Header(int rank, int64_t step, uint64_t part) {
  v1::RequestHeader h;
  h.set_worker_rank(rank);
  h.set_step(step);
  h.set_push_part(part);
  return h;
}

GradientPush Push(int64_t id) {
  return {TableGradients{0, kDim, {id}, std::vector<float>(kDim, 1.0f)}};
}

TEST(ReplicationJoin, AnExistingClockAppliesTheCopiedStepBeforeTheNewUnitsCount) {
  auto store = testing::TestLayeredStore({testing::TestTableSpec("t", kDim)}, 8);
  ASSERT_NE(store, nullptr);
  ShardServerOptions options;
  options.consistency.world_size = 2;
  options.consistency.step_timeout = absl::Seconds(10);
  Replication replication(store.get(), &options);
  // This server backs some units of p from step 6 on.
  ASSERT_TRUE(replication.JoinAsBackup("p", 5).ok());
  // Rank 0's push of step 6 is here; rank 1's forward is on its way.
  ASSERT_TRUE(replication.ApplyForwarded("p", Header(0, 6, 11), Push(1)).ok());
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(replication.ApplyForwarded("p", Header(1, 6, 12), Push(1)).ok());
  });
  // More of p's units were copied here, their rows as of step 6.
  std::vector<float> before(kDim), after(kDim);
  ASSERT_TRUE(store->Lookup(0, {2}, before.data()).ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(replication.JoinAsBackup("p", 6).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150)) << "it waited for step 6";
  // Rank 0's retry of step 6, forwarded again by the new map with an id of
  // a new unit: a push of a step this clock applied, dropped.
  ASSERT_TRUE(replication.ApplyForwarded("p", Header(0, 6, 13), Push(2)).ok());
  late.join();
  ASSERT_TRUE(store->ReadRows(0, {2}, after.data()).ok());
  EXPECT_EQ(before, after) << "the copied row took step 6 a second time";
}

}  // namespace
}  // namespace recps::server

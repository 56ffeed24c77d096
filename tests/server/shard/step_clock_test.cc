#include "server/shard/step_clock.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace recps::server {
namespace {

GradientPush OnePush(int table, std::vector<int64_t> ids, std::vector<float> grads,
                     int dim = 1) {
  return {TableGradients{table, dim, std::move(ids), std::move(grads)}};
}

// Records what the clock applies.
struct Applied {
  std::vector<GradientPush> pushes;
  StepClock::ApplyFn Fn() {
    return [this](GradientPush& p) {
      pushes.push_back(p);
      return absl::OkStatus();
    };
  }
};

// Lookup readiness as seen by a callback.
struct Ready {
  absl::Notification done;
  absl::Status status;
  absl::AnyInvocable<void(absl::Status) &&> Fn() {
    return [this](absl::Status s) {
      status = s;
      done.Notify();
    };
  }
};

ConsistencyOptions Sync(int world) {
  ConsistencyOptions o;
  o.world_size = world;
  return o;
}

TEST(StepClock, SyncLookupWaitsForEveryWorkersPushOfThePreviousStep) {
  Applied applied;
  StepClock clock(Sync(2), applied.Fn());
  Ready step0;
  clock.AwaitLookup(0, step0.Fn());
  ASSERT_TRUE(step0.done.HasBeenNotified());  // nothing to wait for

  Ready step1;
  clock.AwaitLookup(1, step1.Fn());
  EXPECT_FALSE(step1.done.HasBeenNotified());
  ASSERT_TRUE(clock.Push(1, 0, OnePush(0, {7}, {1.0f})).ok());
  EXPECT_FALSE(step1.done.HasBeenNotified());
  EXPECT_TRUE(applied.pushes.empty());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {7}, {2.0f})).ok());
  ASSERT_TRUE(step1.done.HasBeenNotified());
  EXPECT_TRUE(step1.status.ok());
  EXPECT_EQ(clock.applied_step(), 0);
  ASSERT_EQ(applied.pushes.size(), 1u);  // applied once, summed
  EXPECT_EQ(applied.pushes[0][0].grads, std::vector<float>{3.0f});
}

TEST(StepClock, WorkerWithNoIdsStillCompletesTheStep) {
  Applied applied;
  StepClock clock(Sync(2), applied.Fn());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {1.0f})).ok());
  ASSERT_TRUE(clock.Push(1, 0, GradientPush{}).ok());
  EXPECT_EQ(clock.applied_step(), 0);
}

TEST(StepClock, RefusesPastStepsFutureStepsAndStrangers) {
  Applied applied;
  StepClock clock(Sync(1), applied.Fn());
  ASSERT_TRUE(clock.Push(0, 0, {}).ok());
  absl::Status past = clock.Push(0, 0, {});
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(past.message().find("already applied"), absl::string_view::npos);
  absl::Status ahead = clock.Push(0, 5, {});
  EXPECT_EQ(ahead.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ahead.message().find("ahead"), absl::string_view::npos);
  absl::Status stranger = clock.Push(3, 1, {});
  EXPECT_EQ(stranger.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stranger.message().find("rank 3"), absl::string_view::npos);
  EXPECT_EQ(clock.Push(0, -1, {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StepClock, AReplicaClockDropsARetryOfAForwardedPushByItsIds) {
  // A backup's clock of its primary, promoted: worker 0's push of step 0
  // came forwarded (part 11); after the failover the worker retries it on
  // this server under a new part id, with one more id re-routed here.
  Applied applied;
  ConsistencyOptions o = Sync(2);
  o.replica = true;
  o.forward_window = 8;
  StepClock clock(o, applied.Fn());
  EXPECT_FALSE(clock.Arrived(0, 0));
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1, 2}, {1.0f, 2.0f}), 11).ok());
  EXPECT_TRUE(clock.Arrived(0, 0));
  EXPECT_FALSE(clock.Arrived(1, 0));
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {2, 3}, {2.0f, 3.0f}), 12).ok());
  // The same id with another gradient is no retry.
  absl::Status other = clock.Push(0, 0, OnePush(0, {1}, {5.0f}), 13);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("not a retry"), absl::string_view::npos);
  // Pushes may run ahead by the forward window.
  ASSERT_TRUE(clock.Push(1, 3, OnePush(0, {9}, {1.0f}), 14).ok());
  ASSERT_TRUE(clock.Push(1, 0, OnePush(0, {1}, {10.0f}), 15).ok());
  ASSERT_EQ(applied.pushes.size(), 1u);
  const TableGradients& sum = applied.pushes[0][0];
  EXPECT_EQ(sum.ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(sum.grads, (std::vector<float>{11.0f, 2.0f, 3.0f}));  // id 2 once
  // A retry of a step already applied is dropped, not refused.
  EXPECT_TRUE(clock.Push(0, 0, OnePush(0, {2}, {2.0f}), 16).ok());
  EXPECT_EQ(applied.pushes.size(), 1u);
  EXPECT_TRUE(clock.Arrived(1, 0));
}

TEST(StepClock, AnAsyncReplicaClockDropsTheIdsOfItsNewestStepAppliedAlready) {
  Applied applied;
  ConsistencyOptions o = Sync(2);
  o.mode = ConsistencyMode::kAsync;
  o.replica = true;
  StepClock clock(o, applied.Fn());
  ASSERT_TRUE(clock.Push(0, 5, OnePush(0, {1, 2}, {1.0f, 2.0f}), 21).ok());
  // The worker's retry on the promoted server: new part id, one id more.
  ASSERT_TRUE(clock.Push(0, 5, OnePush(0, {2, 3}, {2.0f, 3.0f}), 22).ok());
  // Another rank's push of the same ids is no retry; nor is the next step.
  ASSERT_TRUE(clock.Push(1, 5, OnePush(0, {1}, {4.0f}), 23).ok());
  ASSERT_TRUE(clock.Push(0, 6, OnePush(0, {1}, {5.0f}), 24).ok());
  ASSERT_EQ(applied.pushes.size(), 4u);
  EXPECT_EQ(applied.pushes[1][0].ids, std::vector<int64_t>{3});
  EXPECT_EQ(applied.pushes[1][0].grads, std::vector<float>{3.0f});
  EXPECT_EQ(applied.pushes[2][0].ids, std::vector<int64_t>{1});
  EXPECT_EQ(applied.pushes[3][0].ids, std::vector<int64_t>{1});
}

TEST(StepClock, RepeatedPushOfAStepIsIgnored) {
  Applied applied;
  StepClock clock(Sync(2), applied.Fn());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {1.0f})).ok());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {100.0f})).ok());  // a retry
  ASSERT_TRUE(clock.Push(1, 0, {}).ok());
  ASSERT_EQ(applied.pushes.size(), 1u);
  EXPECT_EQ(applied.pushes[0][0].grads, std::vector<float>{1.0f});
}

TEST(StepClock, LatePartMergesWhileThePushIsPending) {
  Applied applied;
  StepClock clock(Sync(2), applied.Fn());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {1.0f}), 3).ok());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {1.0f}), 3).ok());   // retry
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {2}, {2.0f}), 4).ok());   // part 2
  EXPECT_EQ(clock.Push(0, 0, OnePush(0, {2}, {5.0f}), 5).code(),   // id twice
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(clock.Push(1, 0, OnePush(0, {2, 1}, {20.0f, 10.0f}), 9).ok());
  ASSERT_EQ(applied.pushes.size(), 1u);
  // Per id: rank 0's gradient + rank 1's, each once.
  const TableGradients& sum = applied.pushes[0][0];
  ASSERT_EQ(sum.ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(sum.grads, (std::vector<float>{11.0f, 22.0f}));
  // After the apply: a retry is still dropped, a new part refused.
  EXPECT_TRUE(clock.Push(0, 0, OnePush(0, {2}, {2.0f}), 4).ok());
  EXPECT_EQ(clock.Push(0, 0, OnePush(0, {3}, {2.0f}), 6).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(applied.pushes.size(), 1u);
}

TEST(StepClock, AsyncAppliesEachPartOnceAndWaitAppliedReturns) {
  Applied applied;
  ConsistencyOptions o;
  o.mode = ConsistencyMode::kAsync;
  StepClock clock(o, applied.Fn());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {1.0f}), 3).ok());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {1.0f}), 3).ok());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {2}, {1.0f}), 4).ok());
  EXPECT_EQ(applied.pushes.size(), 2u);
  EXPECT_TRUE(clock.WaitApplied(0, absl::Seconds(1)).ok());
  EXPECT_EQ(clock.WaitApplied(5, absl::Milliseconds(60)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(StepClock, BoundedLetsLookupsRunAheadByTheStaleness) {
  Applied applied;
  ConsistencyOptions o = Sync(1);
  o.mode = ConsistencyMode::kBounded;
  o.staleness = 2;
  StepClock clock(o, applied.Fn());
  Ready s2, s3;
  clock.AwaitLookup(2, s2.Fn());
  clock.AwaitLookup(3, s3.Fn());
  EXPECT_TRUE(s2.done.HasBeenNotified());
  EXPECT_FALSE(s3.done.HasBeenNotified());
  // Steps may be pushed out of order within the window; applied in order.
  ASSERT_TRUE(clock.Push(0, 1, OnePush(0, {1}, {10.0f})).ok());
  EXPECT_TRUE(applied.pushes.empty());
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {1.0f})).ok());
  ASSERT_EQ(applied.pushes.size(), 2u);
  EXPECT_EQ(applied.pushes[0][0].grads[0], 1.0f);
  EXPECT_EQ(applied.pushes[1][0].grads[0], 10.0f);
  EXPECT_TRUE(s3.done.HasBeenNotified());
}

TEST(StepClock, AsyncAppliesOnArrivalAndNeverWaits) {
  Applied applied;
  ConsistencyOptions o = Sync(2);
  o.mode = ConsistencyMode::kAsync;
  StepClock clock(o, applied.Fn());
  ASSERT_TRUE(clock.Push(1, 4, OnePush(0, {1}, {1.0f})).ok());
  EXPECT_EQ(applied.pushes.size(), 1u);
  Ready r;
  clock.AwaitLookup(100, r.Fn());
  EXPECT_TRUE(r.done.HasBeenNotified());
}

TEST(StepClock, StuckStepTimesOutNamingTheMissingWorkers) {
  Applied applied;
  ConsistencyOptions o = Sync(3);
  o.step_timeout = absl::Milliseconds(100);
  StepClock clock(o, applied.Fn());
  ASSERT_TRUE(clock.Push(1, 0, {}).ok());
  Ready r;
  clock.AwaitLookup(1, r.Fn());
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status.message().find("rank(s) 0, 2 (1 of 3 arrived)"),
            absl::string_view::npos)
      << r.status;
}

TEST(StepClock, ApplyFailureIsReportedToWaitersAndLaterCalls) {
  StepClock clock(Sync(1), [](GradientPush&) {
    return absl::ResourceExhaustedError("table t is full");
  });
  Ready r;
  clock.AwaitLookup(1, r.Fn());
  absl::Status s = clock.Push(0, 0, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(r.done.HasBeenNotified());
  EXPECT_FALSE(r.status.ok());
  Ready later;
  clock.AwaitLookup(1, later.Fn());
  EXPECT_NE(later.status.message().find("applying step 0 failed"),
            absl::string_view::npos);
}

TEST(StepClock, ShutdownFailsWaitingLookups) {
  Ready r;
  {
    StepClock clock(Sync(2), [](GradientPush&) { return absl::OkStatus(); });
    clock.AwaitLookup(1, r.Fn());
  }
  ASSERT_TRUE(r.done.HasBeenNotified());
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable);
}

// A server that owned nothing joins a running job at the source's step
// (slot move to a new or drained server).
TEST(StepClock, AdoptStepJoinsARunningJobAtTheSourcesStep) {
  Applied applied;
  StepClock clock(Sync(2), applied.Fn());
  // Left over from when it last owned slots: dropped on adoption.
  ASSERT_TRUE(clock.Push(0, 0, OnePush(0, {1}, {1.0f})).ok());
  Ready waiting;
  clock.AwaitLookup(866, waiting.Fn());
  EXPECT_FALSE(waiting.done.HasBeenNotified());
  ASSERT_TRUE(clock.AdoptStep(865).ok());
  EXPECT_EQ(clock.applied_step(), 865);
  ASSERT_TRUE(waiting.done.HasBeenNotified());
  EXPECT_TRUE(waiting.status.ok()) << waiting.status;
  // Step 866 is the next to apply; an empty push of an adopted step (a rank
  // that routed it by a map without this server's share) is dropped; one
  // with ids would be lost and is refused.
  EXPECT_TRUE(clock.Push(1, 865, GradientPush{}).ok());
  EXPECT_EQ(clock.Push(1, 865, OnePush(0, {5}, {1.0f})).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(clock.Push(0, 866, OnePush(0, {5}, {1.0f})).ok());
  ASSERT_TRUE(clock.Push(1, 866, OnePush(0, {5}, {2.0f})).ok());
  EXPECT_EQ(clock.applied_step(), 866);
  ASSERT_EQ(applied.pushes.size(), 1u);
  EXPECT_EQ(applied.pushes[0][0].grads, std::vector<float>({3.0f}));
  // Never backwards; bad steps refused.
  EXPECT_TRUE(clock.AdoptStep(10).ok());
  EXPECT_EQ(clock.applied_step(), 866);
  EXPECT_EQ(clock.AdoptStep(-2).code(), absl::StatusCode::kInvalidArgument);
}

// A rollback: the earlier run's buffered pushes, push identities and
// waiting lookups are gone, and the clock runs again from the new start.
TEST(StepClock, RestartForgetsTheEarlierRun) {
  Applied applied;
  StepClock clock(Sync(2), applied.Fn());
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(clock.Push(0, step, OnePush(0, {1}, {1.0f}), 100 + step).ok());
    ASSERT_TRUE(clock.Push(1, step, OnePush(0, {1}, {1.0f}), 200 + step).ok());
  }
  ASSERT_TRUE(clock.Push(0, 3, OnePush(0, {1}, {5.0f}), 103).ok());  // rank 1 died
  Ready waiting;
  clock.AwaitLookup(4, waiting.Fn());
  ASSERT_FALSE(waiting.done.HasBeenNotified());
  ASSERT_TRUE(clock.Restart(0).ok());
  ASSERT_TRUE(waiting.done.HasBeenNotified());
  EXPECT_TRUE(absl::IsAborted(waiting.status)) << waiting.status;
  EXPECT_FALSE(clock.started());
  EXPECT_EQ(clock.applied_step(), -1);
  // What a restored server does next, then the new run's pushes, with the
  // same identities as the earlier run's: not taken for retries.
  ASSERT_TRUE(clock.ResumeAt(2).ok());
  applied.pushes.clear();
  ASSERT_TRUE(clock.Push(0, 2, OnePush(0, {1}, {2.0f}), 102).ok());
  ASSERT_TRUE(clock.Push(1, 2, OnePush(0, {1}, {3.0f}), 202).ok());
  ASSERT_TRUE(clock.Push(1, 3, OnePush(0, {1}, {4.0f}), 203).ok());
  ASSERT_TRUE(clock.Push(0, 3, OnePush(0, {1}, {6.0f}), 103).ok());
  EXPECT_EQ(clock.applied_step(), 3);
  ASSERT_EQ(applied.pushes.size(), 2u);
  EXPECT_EQ(applied.pushes[0][0].grads, std::vector<float>{5.0f});
  // Step 3's sum holds the new rank 0 push, not the one kept from before.
  EXPECT_EQ(applied.pushes[1][0].grads, std::vector<float>{10.0f});
  EXPECT_TRUE(absl::IsInvalidArgument(clock.Restart(-1)));
}

TEST(SumInRankOrder, SumsPerIdInRankOrderAcrossTables) {
  std::vector<GradientPush> pushes(3);
  pushes[0] = {TableGradients{0, 2, {5, 6}, {1, 2, 3, 4}}};
  pushes[1] = {TableGradients{1, 1, {5}, {7}},
               TableGradients{0, 2, {6, 9}, {10, 20, 30, 40}}};
  pushes[2] = {TableGradients{0, 2, {6}, {0.1f, 0.2f}}};
  GradientPush sum = SumInRankOrder(pushes);
  ASSERT_EQ(sum.size(), 2u);
  EXPECT_EQ(sum[0].table, 0);
  EXPECT_EQ(sum[0].ids, (std::vector<int64_t>{5, 6, 9}));
  // Id 6: ((3 + 10) + 0.1), in rank order, then 4 + 20 + 0.2.
  const std::vector<float> want = {1, 2, (3.0f + 10.0f) + 0.1f,
                                   (4.0f + 20.0f) + 0.2f, 30, 40};
  EXPECT_EQ(sum[0].grads, want);
  EXPECT_EQ(sum[1].table, 1);
  EXPECT_EQ(sum[1].grads, std::vector<float>{7});
}

// The first push of a table is taken whole when its ids are distinct; with
// a repeated id (never from the server, which refuses those) the rows are
// still summed.
TEST(SumInRankOrder, RepeatedIdInTheFirstPushIsStillSummed) {
  std::vector<GradientPush> pushes(2);
  pushes[0] = {TableGradients{0, 1, {4, 4, 5}, {1, 2, 3}}};
  pushes[1] = {TableGradients{0, 1, {5, 6}, {10, 20}}};
  GradientPush sum = SumInRankOrder(pushes);
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_EQ(sum[0].ids, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(sum[0].grads, (std::vector<float>{3, 13, 20}));
}

// Ids dense in a small range are placed through a flat array, spread ids
// (dynamic tables, any int64) through a hash map: the same pushes with
// their ids spread out sum to the same rows, in the same order, bit for
// bit, and the extreme ids do not overflow the range.
TEST(SumInRankOrder, DenseAndSpreadIdsGiveTheSameSum) {
  auto make = [](int64_t (*map)(int64_t)) {
    std::vector<GradientPush> pushes(3);
    for (int rank = 0; rank < 3; ++rank) {
      for (int table = 0; table < 2; ++table) {
        TableGradients tg{table, 3, {}, {}};
        for (int64_t i = 0; i < 2000; ++i) {
          // Distinct within a push, overlapping across pushes.
          const int64_t id = (i * (7 + rank) + 13 * rank) % 5003;
          if (std::find(tg.ids.begin(), tg.ids.end(), map(id)) != tg.ids.end()) continue;
          tg.ids.push_back(map(id));
          for (int j = 0; j < 3; ++j) {
            tg.grads.push_back(static_cast<float>(std::sin(id * 0.37 + j + rank * 1.1)));
          }
        }
        pushes[rank].push_back(std::move(tg));
      }
    }
    return pushes;
  };
  auto dense = make([](int64_t id) { return id; });
  auto spread = make([](int64_t id) {
    return id == 0      ? std::numeric_limits<int64_t>::min()
           : id == 5002 ? std::numeric_limits<int64_t>::max()
                        : id * 1000003 - (int64_t{1} << 40);
  });
  const GradientPush a = SumInRankOrder(dense);
  const GradientPush b = SumInRankOrder(spread);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(a[t].ids.size(), b[t].ids.size());
    EXPECT_GT(a[t].ids.size(), 2000u);  // later ranks added rows
    ASSERT_EQ(a[t].grads.size(), b[t].grads.size());
    EXPECT_EQ(0, std::memcmp(a[t].data(), b[t].data(), 4 * a[t].grads.size()));
    for (size_t i = 0; i < a[t].ids.size(); ++i) {
      const int64_t id = a[t].ids[i];
      const int64_t want = id == 0      ? std::numeric_limits<int64_t>::min()
                           : id == 5002 ? std::numeric_limits<int64_t>::max()
                                        : id * 1000003 - (int64_t{1} << 40);
      ASSERT_EQ(b[t].ids[i], want) << i;
    }
  }
}

TEST(StepClock, ParkingLimitsRefuseWithResourceExhausted) {
  Applied applied;
  ConsistencyOptions o = Sync(2);
  o.max_parked_lookups = 2;
  o.max_parked_ids = 100;
  StepClock clock(o, applied.Fn());
  Ready a, b, c, big;
  clock.AwaitLookup(1, a.Fn(), 40);
  clock.AwaitLookup(1, big.Fn(), 61);  // 40 + 61 > 100
  ASSERT_TRUE(big.done.HasBeenNotified());
  EXPECT_EQ(big.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status.message().find("--max_parked_ids=100"), std::string::npos)
      << big.status;
  clock.AwaitLookup(1, b.Fn(), 60);
  EXPECT_EQ(clock.waiting_lookups(), 2);
  EXPECT_EQ(clock.waiting_ids(), 100);
  clock.AwaitLookup(1, c.Fn(), 0);
  ASSERT_TRUE(c.done.HasBeenNotified());
  EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status.message().find("--max_parked_lookups=2"), std::string::npos)
      << c.status;
  // The step completes: the parked ones run and the budget is free again.
  ASSERT_TRUE(clock.Push(0, 0, {}).ok());
  ASSERT_TRUE(clock.Push(1, 0, {}).ok());
  EXPECT_TRUE(a.done.HasBeenNotified() && a.status.ok());
  EXPECT_TRUE(b.done.HasBeenNotified() && b.status.ok());
  EXPECT_EQ(clock.waiting_ids(), 0);
}

TEST(StepClock, CancelledLookupIsDroppedLongBeforeTheStepTimeout) {
  Applied applied;
  ConsistencyOptions o = Sync(2);
  o.step_timeout = absl::Seconds(600);
  StepClock clock(o, applied.Fn());
  std::atomic<bool> gone{false};
  Ready r;
  clock.AwaitLookup(1, r.Fn(), 10, [&] { return gone.load(); });
  EXPECT_EQ(clock.waiting_lookups(), 1);
  gone = true;
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(clock.waiting_lookups(), 0);
  EXPECT_EQ(clock.waiting_ids(), 0);
  // Already cancelled when it arrives: never parked.
  Ready late;
  clock.AwaitLookup(1, late.Fn(), 10, [] { return true; });
  ASSERT_TRUE(late.done.HasBeenNotified());
  EXPECT_EQ(late.status.code(), absl::StatusCode::kCancelled);
}

// ---- Borrowed rows (TableGradients::borrowed: fp32 pushes read in place) ----

// A push whose rows point into `values` (the request that carried them).
GradientPush BorrowedPush(int table, std::vector<int64_t> ids,
                          const std::vector<float>& values) {
  TableGradients tg{table, 1, std::move(ids), {}};
  tg.borrowed = values.data();
  return {std::move(tg)};
}

// Records the values each applied step saw, and whether they were read in
// place from `watched`.
struct AppliedValues {
  std::vector<std::vector<float>> values;
  std::vector<bool> in_place;
  const float* watched = nullptr;
  StepClock::ApplyFn Fn() {
    return [this](GradientPush& p) {
      values.emplace_back();
      for (const TableGradients& tg : p) {
        values.back().insert(values.back().end(), tg.data(),
                             tg.data() + tg.ids.size() * tg.dim);
      }
      in_place.push_back(p.size() == 1 && p[0].data() == watched);
      return absl::OkStatus();
    };
  }
};

TEST(StepClock, BorrowedPushThatCompletesTheStepIsAppliedInPlace) {
  AppliedValues applied;
  StepClock clock(Sync(1), applied.Fn());
  std::vector<float> request = {1.5f, 2.5f};
  applied.watched = request.data();
  ASSERT_TRUE(clock.Push(0, 0, BorrowedPush(0, {3, 4}, request)).ok());
  ASSERT_EQ(applied.values.size(), 1u);
  EXPECT_EQ(applied.values[0], (std::vector<float>{1.5f, 2.5f}));
  EXPECT_TRUE(applied.in_place[0]);  // no copy of the request's rows
}

TEST(StepClock, BorrowedPushKeptForTheOtherRanksIsCopied) {
  AppliedValues applied;
  StepClock clock(Sync(2), applied.Fn());
  std::vector<float> first = {1, 2};
  ASSERT_TRUE(clock.Push(0, 0, BorrowedPush(0, {3, 4}, first)).ok());
  // The first request is gone once its push returned.
  first.assign({-100, -100});
  std::vector<float> second = {10, 20};
  ASSERT_TRUE(clock.Push(1, 0, BorrowedPush(0, {3, 4}, second)).ok());
  ASSERT_EQ(applied.values.size(), 1u);
  EXPECT_EQ(applied.values[0], (std::vector<float>{11, 22}));
  EXPECT_EQ(second, (std::vector<float>{10, 20}));  // summed into a copy
}

TEST(StepClock, BorrowedPushOfAStepAnotherThreadWillApplyIsCopied) {
  // Bounded: step 1 may arrive while step 0 is applied on another thread,
  // which then applies step 1 too, after step 1's push returned.
  absl::Notification applying0, release0;
  std::vector<std::vector<float>> seen;
  ConsistencyOptions o = Sync(1);
  o.mode = ConsistencyMode::kBounded;
  o.staleness = 1;
  StepClock clock(o, [&](GradientPush& p) {
    seen.emplace_back(p[0].data(), p[0].data() + p[0].ids.size());
    if (seen.size() == 1) {
      applying0.Notify();
      release0.WaitForNotification();
    }
    return absl::OkStatus();
  });
  std::vector<float> step0 = {1};
  std::thread first([&] { ASSERT_TRUE(clock.Push(0, 0, BorrowedPush(0, {7}, step0)).ok()); });
  applying0.WaitForNotification();
  {
    std::vector<float> step1 = {2};
    ASSERT_TRUE(clock.Push(0, 1, BorrowedPush(0, {7}, step1)).ok());
    step1.assign({-100});
  }
  release0.Notify();
  first.join();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<float>{2}));
}

TEST(SumInRankOrder, BorrowedFirstPushIsNotWrittenTo) {
  std::vector<float> first = {1, 2};
  std::vector<GradientPush> pushes(2);
  pushes[0] = BorrowedPush(0, {4, 5}, first);
  pushes[1] = {TableGradients{0, 1, {5, 6}, {10, 20}}};
  GradientPush sum = SumInRankOrder(pushes);
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_EQ(sum[0].ids, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(std::vector<float>(sum[0].data(), sum[0].data() + 3),
            (std::vector<float>{1, 12, 20}));
  EXPECT_EQ(first, (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace recps::server

namespace recps::server {
namespace {

// After a failover the units taken over step on the lost primary's replica
// clock until it and the server's own clock are between steps at one step;
// then it is merged into the own clock (server/shard/replication.h).
TEST(StepClock, AMergedLineageClockHandsItsLookupsRetriesAndCutsToTheClockItJoined) {
  Applied own_applied, lineage_applied;
  StepClock own(Sync(2), own_applied.Fn());
  ConsistencyOptions replica = Sync(2);
  replica.replica = true;
  replica.forward_window = 8;
  StepClock lineage(replica, lineage_applied.Fn());
  for (int rank : {0, 1}) {
    ASSERT_TRUE(own.Push(rank, 0, OnePush(0, {1}, {1.0f}), 10 + rank).ok());
    ASSERT_TRUE(lineage.Push(rank, 0, OnePush(0, {2}, {1.0f}), 20 + rank).ok());
  }
  ASSERT_TRUE(lineage.Push(0, 1, OnePush(0, {2}, {1.0f}), 30).ok());
  EXPECT_FALSE(lineage.BetweenSteps());
  EXPECT_EQ(lineage.MergeInto(&own).code(), absl::StatusCode::kFailedPrecondition)
      << "a rank's push of step 1 is pending there";
  ASSERT_TRUE(lineage.Push(1, 1, OnePush(0, {2}, {1.0f}), 31).ok());
  EXPECT_EQ(lineage.MergeInto(&own).code(), absl::StatusCode::kFailedPrecondition)
      << "step 1 is applied there, not here";
  Ready parked;
  lineage.AwaitLookup(3, parked.Fn());
  for (int rank : {0, 1}) ASSERT_TRUE(own.Push(rank, 1, OnePush(0, {1}, {1.0f}), 40 + rank).ok());
  ASSERT_TRUE(lineage.MergeInto(&own).ok());
  EXPECT_EQ(lineage.merged_into(), &own);
  EXPECT_EQ(lineage.MergeInto(&own).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(lineage.waiting_lookups(), 0);
  EXPECT_EQ(own.waiting_lookups(), 1) << "the parked lookup moved";
  // A worker's late retry of a push the lineage clock took is dropped by
  // the own clock too (it would be "step already applied" otherwise).
  EXPECT_TRUE(own.Push(1, 1, OnePush(0, {2}, {1.0f}), 31).ok());
  EXPECT_EQ(own.Push(1, 1, OnePush(0, {2}, {1.0f}), 99).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(own_applied.pushes.size(), 2u);
  for (int rank : {0, 1}) ASSERT_TRUE(own.Push(rank, 2, OnePush(0, {1, 2}, {1.0f, 1.0f})).ok());
  ASSERT_TRUE(parked.done.HasBeenNotified());
  EXPECT_TRUE(parked.status.ok());
  // Later calls on the merged clock are the own clock's.
  Ready later;
  lineage.AwaitLookup(3, later.Fn());
  EXPECT_TRUE(later.done.HasBeenNotified());
  bool cut = false;
  EXPECT_TRUE(lineage.RunAtCut(3, absl::Seconds(1), [&] {
    cut = true;
    return absl::OkStatus();
  }).ok());
  EXPECT_TRUE(cut);
  EXPECT_TRUE(lineage.WaitApplied(2, absl::Seconds(1)).ok());
  EXPECT_EQ(lineage_applied.pushes.size(), 2u) << "nothing applied on the merged clock";
}

}  // namespace
}  // namespace recps::server

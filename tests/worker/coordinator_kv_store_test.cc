// The coordinator's KV as the workers' rendezvous store, against an
// in-process coordinator service on loopback: set/get/wait with deadlines,
// a wait that outlives a coordinator restart on the same port and state,
// Gloo (and NCCL, with a GPU) meeting through it, and a fresh rendezvous
// prefix per start.
#include "worker/collectives/coordinator_kv_store.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/coordinator_store.h"
#include "tests/testing/in_process_coordinator.h"
#include "tests/testing/local_shard.h"
#include "kernels/cuda_util.h"
#include "worker/collectives/gloo_collectives.h"
#include "worker/collectives/nccl_collectives.h"
#include "tests/testing/gpu_test_util.h"

namespace recps::worker {
namespace {

using ::testing::HasSubstr;

using testing::InProcessCoordinator;

TEST(CoordinatorKeyValueStore, SetGetWaitAndDeadlines) {
  testing::TempDir dir;
  auto coordinator = InProcessCoordinator::Start(dir.path() + "/state");
  ASSERT_NE(coordinator, nullptr);
  client::CoordinatorClient client(coordinator->address());
  CoordinatorKeyValueStore store(&client);

  ASSERT_TRUE(store.Set("run/a", std::string("x\0y", 3)).ok());
  absl::StatusOr<std::string> a = store.Get("run/a", absl::Seconds(1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, std::string("x\0y", 3));

  // A get that waits for a later set: the key is set only once the
  // coordinator holds the get parked.
  std::thread setter([&] {
    ASSERT_TRUE(testing::Eventually(
        [&] { return coordinator->coordinator().pending_kv_waits() == 1; }));
    ASSERT_TRUE(store.Set("run/b", "later").ok());
  });
  absl::StatusOr<std::string> b = store.Get("run/b", absl::Seconds(30));
  setter.join();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, "later");
  EXPECT_TRUE(store.Wait({"run/a", "run/b"}, absl::Seconds(1)).ok());

  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> missing = store.Get("run/never", absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("run/never"));
  // Tells a hang from a slow, loaded machine; not a speed check.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  absl::Status wait = store.Wait({"run/a", "run/c"}, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(wait)) << wait;
  EXPECT_THAT(wait.message(), HasSubstr("run/c"));
}

TEST(CoordinatorKeyValueStore, AGetWaitingAcrossACoordinatorRestartReturnsTheValue) {
  testing::TempDir dir;
  const std::string state = dir.path() + "/state";
  auto coordinator = InProcessCoordinator::Start(state);
  ASSERT_NE(coordinator, nullptr);
  const int port = coordinator->port();
  client::CoordinatorClient client(coordinator->address());
  CoordinatorKeyValueStore store(&client);
  ASSERT_TRUE(store.Set("kept", "before").ok());

  absl::StatusOr<std::string> waited;
  std::thread waiter([&] { waited = store.Get("set-after-restart", absl::Seconds(30)); });
  // Restart only once the wait is parked in the old incarnation.
  ASSERT_TRUE(testing::Eventually(
      [&] { return coordinator->coordinator().pending_kv_waits() == 1; }));
  coordinator.reset();  // the pending wait ends with UNAVAILABLE: the client retries
  coordinator = InProcessCoordinator::Start(state, port);
  ASSERT_NE(coordinator, nullptr);

  client::CoordinatorClient other(coordinator->address());
  ASSERT_TRUE(other.KvSet("set-after-restart", "after").ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, "after");
  // Entries are stored: they survive the restart.
  absl::StatusOr<std::string> kept = store.Get("kept", absl::Seconds(1));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "before");
}

TEST(CoordinatorKeyValueStore, AnUnreachableCoordinatorFailsAfterRetryFor) {
  testing::TempDir dir;
  int port = 0;
  {
    auto coordinator = InProcessCoordinator::Start(dir.path() + "/state");
    ASSERT_NE(coordinator, nullptr);
    port = coordinator->port();
  }
  client::CoordinatorClientOptions options;
  options.retry_for = absl::Milliseconds(500);
  client::CoordinatorClient client(absl::StrCat("127.0.0.1:", port), options);
  absl::Status s = client.KvSet("k", "v");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("127.0.0.1:", port)));
}

TEST(CoordinatorKeyValueStore, GlooRanksMeetThroughTheCoordinator) {
  testing::TempDir dir;
  auto coordinator = InProcessCoordinator::Start(dir.path() + "/state");
  ASSERT_NE(coordinator, nullptr);
  constexpr int kWorld = 3;
  std::vector<absl::Status> results(kWorld);
  std::vector<std::vector<float>> data(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      client::CoordinatorClient client(coordinator->address());
      CoordinatorKeyValueStore store(&client);
      absl::StatusOr<std::string> prefix =
          FreshRendezvousPrefix(client, "job", r, kWorld, absl::Seconds(30));
      if (!prefix.ok()) {
        results[r] = prefix.status();
        return;
      }
      auto gloo = CreateGlooCollectives(store, *prefix, r, kWorld, "127.0.0.1",
                                        absl::Seconds(30));
      if (!gloo.ok()) {
        results[r] = gloo.status();
        return;
      }
      data[r] = {1.0f * r, 2.0f};
      results[r] = (*gloo)->AllReduceSum(absl::MakeSpan(data[r]));
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    EXPECT_THAT(data[r], ::testing::ElementsAre(3.0f, 6.0f));
  }
}

// NCCL's unique id travels through the coordinator too (one rank on one
// GPU; skipped without a GPU; a GPU build always has NCCL, so UNIMPLEMENTED
// fails).
TEST(CoordinatorKeyValueStore, NcclUniqueIdGoesThroughTheCoordinator) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  testing::TempDir dir;
  auto coordinator = InProcessCoordinator::Start(dir.path() + "/state");
  ASSERT_NE(coordinator, nullptr);
  client::CoordinatorClient client(coordinator->address());
  CoordinatorKeyValueStore store(&client);
  absl::StatusOr<std::unique_ptr<Collectives>> nccl =
      CreateNcclCollectives(store, "nccl-coordinator", 0, 1, 0, absl::Seconds(60));
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_TRUE(client.KvGet("nccl-coordinator/nccl/unique_id", absl::ZeroDuration()).ok());
  EXPECT_TRUE((*nccl)->Barrier().ok());
}

TEST(CoordinatorKeyValueStore, EachStartOfAJobGetsAFreshPrefix) {
  testing::TempDir dir;
  auto coordinator = InProcessCoordinator::Start(dir.path() + "/state");
  ASSERT_NE(coordinator, nullptr);
  auto meet = [&] {
    std::vector<absl::StatusOr<std::string>> prefixes(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        client::CoordinatorClient client(coordinator->address());
        prefixes[r] = FreshRendezvousPrefix(client, "job", r, 2, absl::Seconds(30));
      });
    }
    for (std::thread& t : ranks) t.join();
    EXPECT_TRUE(prefixes[0].ok()) << prefixes[0].status();
    EXPECT_TRUE(prefixes[1].ok()) << prefixes[1].status();
    EXPECT_EQ(*prefixes[0], *prefixes[1]);
    return *prefixes[0];
  };
  const std::string first = meet();
  const std::string second = meet();
  EXPECT_THAT(first, ::testing::StartsWith("job/"));
  EXPECT_NE(first, second);

  // A rank that waits alone is told who is missing.
  client::CoordinatorClient client(coordinator->address());
  absl::StatusOr<std::string> alone =
      FreshRendezvousPrefix(client, "job", 1, 2, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(alone.status())) << alone.status();
  EXPECT_THAT(alone.status().message(), HasSubstr("rank"));
}

}  // namespace
}  // namespace recps::worker

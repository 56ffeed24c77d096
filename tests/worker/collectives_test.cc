// Gloo collectives as threads of one process and as separate processes,
// peers that never join, stop or die; LocalCollectives and buckets.
#include "worker/collectives/collectives.h"

#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/collectives_test_util.h"
#include "worker/collectives/gloo_collectives.h"
#include "worker/collectives/host_staged_collectives.h"
#include "worker/collectives/kv_store.h"

namespace recps::worker {
namespace {

using ::recps::worker::testing::CheckSum;
using ::recps::worker::testing::RankInput;
using ::recps::worker::testing::RunChildren;
using ::recps::worker::testing::RunThreads;
using ::recps::worker::testing::TempDir;
using ::recps::worker::testing::UniquePrefix;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(10);

// -------------------------------------------------------- local and buckets

class RecordingCollectives : public LocalCollectives {
 public:
  absl::Status AllReduceSum(absl::Span<float> data) override {
    sizes.push_back(data.size());
    for (float& x : data) x *= 2;
    return absl::OkStatus();
  }
  std::vector<size_t> sizes;
};

TEST(AllReduceInBucketsTest, SplitsIntoBucketsAndCoversEverything) {
  RecordingCollectives c;
  std::vector<float> data(10, 1.0f);
  ASSERT_TRUE(AllReduceInBuckets(c, absl::MakeSpan(data), 4).ok());
  EXPECT_THAT(c.sizes, ::testing::ElementsAre(4, 4, 2));
  EXPECT_THAT(data, ::testing::Each(2.0f));
  EXPECT_TRUE(AllReduceInBuckets(c, {}, 4).ok());
  EXPECT_TRUE(
      absl::IsInvalidArgument(AllReduceInBuckets(c, absl::MakeSpan(data), 0)));
}

TEST(LocalCollectivesTest, IsTheIdentity) {
  LocalCollectives c;
  std::vector<float> data = {1, 2, 3};
  EXPECT_TRUE(c.AllReduceSum(absl::MakeSpan(data)).ok());
  EXPECT_TRUE(c.Broadcast(absl::MakeSpan(data), 0).ok());
  EXPECT_TRUE(c.Barrier().ok());
  EXPECT_THAT(data, ::testing::ElementsAre(1, 2, 3));
  EXPECT_TRUE(absl::IsInvalidArgument(c.Broadcast(absl::MakeSpan(data), 1)));
}

// ---------------------------------------------------------------- Gloo ranks

// Allreduce at several sizes (10M floats in buckets), broadcast from root 1
// (0 when alone) and a barrier that every rank must have reached.
absl::Status Exercise(Collectives& c, std::atomic<int>* arrived) {
  const int w = c.world_size();
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{262147}}) {
    std::vector<float> v = RankInput(c.rank(), n);
    absl::Status s = c.AllReduceSum(absl::MakeSpan(v));
    if (!s.ok()) return s;
    s = CheckSum(v, w);
    if (!s.ok()) return s;
  }
  std::vector<float> big = RankInput(c.rank(), 10'000'000);
  absl::Status s = AllReduceInBuckets(c, absl::MakeSpan(big), 1 << 20);
  if (!s.ok()) return s;
  s = CheckSum(big, w);
  if (!s.ok()) return s;

  const int root = w > 1 ? 1 : 0;
  std::vector<float> b(1001, float(c.rank()));
  s = c.Broadcast(absl::MakeSpan(b), root);
  if (!s.ok()) return s;
  for (float x : b) {
    if (x != float(root)) return absl::InternalError("broadcast mismatch");
  }
  if (!absl::IsInvalidArgument(c.Broadcast(absl::MakeSpan(b), w))) {
    return absl::InternalError("bad root accepted");
  }

  if (arrived != nullptr) arrived->fetch_add(1);
  s = c.Barrier();
  if (!s.ok()) return s;
  if (arrived != nullptr && arrived->load() != w) {
    return absl::InternalError("barrier returned before every rank arrived");
  }
  return absl::OkStatus();
}

class GlooTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooTest, ThreadsAllReduceBroadcastBarrier) {
  const int w = GetParam();
  InMemoryKeyValueStore store;
  const std::string prefix = UniquePrefix("threads");
  std::atomic<int> arrived{0};
  std::vector<absl::Status> results =
      RunThreads(w, [&](int rank) -> absl::Status {
        absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(
            store, prefix, rank, w, "127.0.0.1", kTimeout);
        if (!c.ok()) return c.status();
        if ((*c)->rank() != rank || (*c)->world_size() != w) {
          return absl::InternalError("wrong rank or world size");
        }
        return Exercise(**c, &arrived);
      });
  for (int r = 0; r < w; ++r)
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST_P(GlooTest, ProcessesThroughFileStore) {
  const int w = GetParam();
  TempDir dir;
  const std::string prefix = UniquePrefix("procs");
  std::vector<std::string> results = RunChildren(
      w, dir.path(), absl::Seconds(40), [&](int rank) -> absl::Status {
        FileKeyValueStore store(dir.path() + "/kv");
        absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(
            store, prefix, rank, w, "127.0.0.1", kTimeout);
        if (!c.ok()) return c.status();
        return Exercise(**c, nullptr);
      });
  for (int r = 0; r < w; ++r) EXPECT_EQ(results[r], "OK") << "rank " << r;
}

// The GPU workers' fallback where NCCL cannot be set up, with its CPU twin
// (kCpu copies): the same sums and broadcasts as Gloo on host buffers, and
// one copy of each buffer each way per call.
TEST(HostStagedCollectivesTest, StagesThroughHostMemoryAndGivesGloosAnswers) {
  TempDir dir;
  FileKeyValueStore store(dir.path() + "/kv");
  const std::string prefix = UniquePrefix("staged");
  std::vector<absl::Status> results = RunThreads(2, [&](int rank) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Collectives>> gloo =
        CreateGlooCollectives(store, prefix, rank, 2, "127.0.0.1", kTimeout);
    if (!gloo.ok()) return gloo.status();
    absl::StatusOr<std::unique_ptr<kernels::ExecResources>> exec =
        kernels::ExecResources::Create(kernels::Device::kCpu, 0, nullptr);
    if (!exec.ok()) return exec.status();
    HostStagedCollectives staged(*std::move(gloo), *std::move(exec));
    std::vector<float> v = RankInput(rank, 1000);
    if (absl::Status s = staged.AllReduceSum(absl::MakeSpan(v)); !s.ok()) return s;
    if (absl::Status s = CheckSum(v, 2); !s.ok()) return s;
    std::vector<float> b(10, float(rank));
    if (absl::Status s = staged.Broadcast(absl::MakeSpan(b), 1); !s.ok()) return s;
    for (float x : b) {
      if (x != 1.0f) return absl::InternalError("broadcast mismatch");
    }
    if (staged.staged_floats() != 1010) {
      return absl::InternalError(absl::StrCat("staged ", staged.staged_floats(), " floats"));
    }
    return staged.Barrier();
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(CreateGpuCollectivesTest, RefusesAnUnknownMode) {
  TempDir dir;
  FileKeyValueStore store(dir.path() + "/kv");
  absl::StatusOr<std::unique_ptr<Collectives>> c =
      CreateGpuCollectives(store, "p", 0, 2, 0, "127.0.0.1", "mpi", kTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("expected auto, nccl or gloo"));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) {
                           return absl::StrCat("World", info.param);
                         });

TEST(GlooFailureTest, PeerThatNeverJoinsFailsWithinTheTimeout) {
  InMemoryKeyValueStore store;
  const std::string prefix = UniquePrefix("missing");
  const absl::Time start = absl::Now();
  // Ranks 0 and 1 of 3; rank 2 never shows up.
  std::vector<absl::Status> results = RunThreads(2, [&](int rank) {
    return CreateGlooCollectives(store, prefix, rank, 3, "127.0.0.1",
                                 absl::Seconds(2))
        .status();
  });
  // Tells a hang from a slow, loaded machine; not a speed check.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (const absl::Status& s : results) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 did not join"));
  }
}

TEST(GlooFailureTest, PeerThatLeavesAfterConnectingGivesUnavailable) {
  InMemoryKeyValueStore store;
  const std::string prefix = UniquePrefix("leaves");
  absl::Barrier* connected = new absl::Barrier(3);  // deleted by the last one
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results =
      RunThreads(3, [&](int rank) -> absl::Status {
        absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(
            store, prefix, rank, 3, "127.0.0.1", absl::Seconds(2));
        if (connected->Block()) delete connected;
        if (!c.ok()) return c.status();
        if (rank == 2) {
          c->reset();  // closes its sockets, as a crash would
          return absl::OkStatus();
        }
        std::vector<float> v(100000, 1.0f);
        absl::Status s = (*c)->AllReduceSum(absl::MakeSpan(v));
        if (!absl::IsUnavailable(s)) {
          return absl::InternalError(
              absl::StrCat("want UNAVAILABLE, got ", s.ToString()));
        }
        // The group stays broken.
        absl::Status again = (*c)->Barrier();
        if (!absl::IsFailedPrecondition(again)) {
          return absl::InternalError(
              absl::StrCat("after failure: ", again.ToString()));
        }
        return absl::OkStatus();
      });
  // Tells a hang from a slow, loaded machine; not a speed check.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(GlooFailureTest, PeerThatStopsCallingTimesOut) {
  InMemoryKeyValueStore store;
  const std::string prefix = UniquePrefix("stuck");
  absl::Notification others_done;
  std::atomic<int> finished{0};
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results =
      RunThreads(3, [&](int rank) -> absl::Status {
        absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(
            store, prefix, rank, 3, "127.0.0.1", absl::Seconds(1));
        if (!c.ok()) return c.status();
        if (rank == 2) {  // alive and connected, but never joins the allreduce
          others_done.WaitForNotificationWithTimeout(absl::Seconds(10));
          return absl::OkStatus();
        }
        std::vector<float> v(1000, 1.0f);
        absl::Status s = (*c)->AllReduceSum(absl::MakeSpan(v));
        if (finished.fetch_add(1) == 1) others_done.Notify();
        return s;
      });
  // Tells a hang from a slow, loaded machine; not a speed check.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsUnavailable(results[r]))
        << "rank " << r << ": " << results[r];
  }
}

TEST(GlooFailureTest, ProcessKilledAfterConnectingGivesUnavailable) {
  TempDir dir;
  const std::string prefix = UniquePrefix("killed");
  std::vector<std::string> results = RunChildren(
      3, dir.path(), absl::Seconds(20), [&](int rank) -> absl::Status {
        FileKeyValueStore store(dir.path() + "/kv");
        absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(
            store, prefix, rank, 3, "127.0.0.1", absl::Seconds(3));
        if (!c.ok()) return c.status();
        absl::Status s = (*c)->Barrier();
        if (!s.ok()) return s;
        if (rank == 2) raise(SIGKILL);
        std::vector<float> v(100000, 1.0f);
        s = (*c)->AllReduceSum(absl::MakeSpan(v));
        if (absl::IsUnavailable(s)) return absl::OkStatus();
        return absl::InternalError(
            absl::StrCat("want UNAVAILABLE, got ", s.ToString()));
      });
  EXPECT_EQ(results[0], "OK");
  EXPECT_EQ(results[1], "OK");
  EXPECT_EQ(results[2], absl::StrCat("killed by signal ", SIGKILL));
}

TEST(GlooTest, RejectsBadArguments) {
  InMemoryKeyValueStore store;
  EXPECT_TRUE(absl::IsInvalidArgument(
      CreateGlooCollectives(store, "p", 2, 2).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(CreateGlooCollectives(store, "", 0, 1).status()));
}

}  // namespace
}  // namespace recps::worker

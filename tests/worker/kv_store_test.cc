// The key-value stores workers rendezvous through: in memory and files.
#include "worker/collectives/kv_store.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/collectives_test_util.h"

namespace recps::worker {
namespace {

using ::recps::worker::testing::RunChildren;
using ::recps::worker::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kTimeout = absl::Seconds(10);

void ExpectGetWaitsForSet(KeyValueStore& store) {
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(store.Set("job/1:addr", "hello").ok());
  });
  absl::StatusOr<std::string> value = store.Get("job/1:addr", kTimeout);
  writer.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "hello");
  ASSERT_TRUE(store.Set("job/1:addr", std::string("a\0b", 3)).ok());
  EXPECT_EQ(*store.Get("job/1:addr", kTimeout), std::string("a\0b", 3));
}

void ExpectTimeoutNamesKey(KeyValueStore& store) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value =
      store.Get("missing/key", absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(value.status())) << value.status();
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("missing/key"));

  ASSERT_TRUE(store.Set("present", "x").ok());
  absl::Status wait = store.Wait({"present", "absent"}, absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(wait)) << wait;
  EXPECT_THAT(std::string(wait.message()), HasSubstr("'absent'"));
  EXPECT_THAT(std::string(wait.message()), Not(HasSubstr("present")));
  EXPECT_TRUE(store.Wait({"present"}, absl::ZeroDuration()).ok());
}

TEST(InMemoryKeyValueStoreTest, GetWaitsForSetFromAnotherThread) {
  InMemoryKeyValueStore store;
  ExpectGetWaitsForSet(store);
}

TEST(InMemoryKeyValueStoreTest, TimeoutNamesTheKey) {
  InMemoryKeyValueStore store;
  ExpectTimeoutNamesKey(store);
}

TEST(FileKeyValueStoreTest, GetWaitsForSetFromAnotherThread) {
  TempDir dir;
  FileKeyValueStore store(dir.path() + "/kv");  // created on first Set
  ExpectGetWaitsForSet(store);
}

TEST(FileKeyValueStoreTest, TimeoutNamesTheKey) {
  TempDir dir;
  FileKeyValueStore store(dir.path());
  ExpectTimeoutNamesKey(store);
}

TEST(FileKeyValueStoreTest, WorksAcrossProcesses) {
  TempDir dir;
  // Each child publishes its key after a delay and reads everyone else's.
  std::vector<std::string> results =
      RunChildren(3, dir.path(), kTimeout, [&](int rank) -> absl::Status {
        FileKeyValueStore store(dir.path() + "/kv");
        absl::SleepFor(absl::Milliseconds(30 * rank));
        absl::Status s =
            store.Set(absl::StrCat("rank/", rank), std::to_string(rank * 7));
        if (!s.ok()) return s;
        for (int peer = 0; peer < 3; ++peer) {
          absl::StatusOr<std::string> v =
              store.Get(absl::StrCat("rank/", peer), kTimeout);
          if (!v.ok()) return v.status();
          if (*v != std::to_string(peer * 7)) return absl::InternalError(*v);
        }
        return absl::OkStatus();
      });
  for (const std::string& r : results) EXPECT_EQ(r, "OK");
}

}  // namespace
}  // namespace recps::worker

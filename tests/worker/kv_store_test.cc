// The key-value stores workers rendezvous through: in memory and files.
#include "worker/collectives/kv_store.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_system.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/checkpoint/faulty_file_system.h"
#include "tests/worker/collectives_test_util.h"

namespace recps::worker {
namespace {

using ::recps::worker::testing::RunChildren;
using ::recps::worker::testing::TempDir;
using ::recps::testing::FaultyFileSystem;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
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

// The names in `dir` (temporary files included); none when it is missing.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  absl::StatusOr<std::vector<FileSystem::DirEntry>> entries =
      FileSystem::Default()->ListDir(dir);
  if (!entries.ok()) return names;
  for (const FileSystem::DirEntry& e : *entries) names.push_back(e.name);
  return names;
}

TEST(FileKeyValueStoreTest, TornWriteIsNeverSeenAndTheWriterGetsTheError) {
  TempDir dir;
  FaultyFileSystem faulty;
  FileKeyValueStore writer(dir.path() + "/kv", absl::Milliseconds(5), &faulty);
  // The reader is another process's view: the plain file system.
  FileKeyValueStore reader(dir.path() + "/kv", absl::Milliseconds(1));
  const std::string value(64 << 10, 'v');
  absl::StatusOr<std::string> seen;
  std::thread waiting([&] { seen = reader.Get("job/1:addr", kTimeout); });

  faulty.TearWrite(1, 100);
  const absl::Status torn = writer.Set("job/1:addr", value);
  EXPECT_TRUE(absl::IsUnavailable(torn)) << torn;
  EXPECT_THAT(std::string(torn.message()), HasSubstr("'job/1:addr'"));
  // Neither the key nor the torn temporary file is left.
  EXPECT_THAT(Names(dir.path() + "/kv"), IsEmpty());
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      reader.Wait({"job/1:addr"}, absl::Milliseconds(20))));

  EXPECT_TRUE(writer.Set("job/1:addr", value).ok());  // the writer's retry
  waiting.join();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->size(), value.size());  // whole: never the first 100 bytes
}

TEST(FileKeyValueStoreTest, FullDiskIsResourceExhaustedNamingTheFile) {
  TempDir dir;
  FaultyFileSystem faulty;
  const std::string kv = dir.path() + "/kv";
  FileKeyValueStore store(kv, absl::Milliseconds(5), &faulty);
  faulty.SetDiskFullAfter(10);
  const absl::Status full = store.Set("rank/0", std::string(100, 'x'));
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(std::string(full.message()), HasSubstr(kv + "/rank%2F0"));
  EXPECT_THAT(std::string(full.message()), HasSubstr("No space left"));
  EXPECT_THAT(Names(kv), IsEmpty());
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      store.Get("rank/0", absl::Milliseconds(20)).status()));

  faulty.SetDiskFullAfter(-1);  // space freed: the same store works again
  ASSERT_TRUE(store.Set("rank/0", "x").ok());
  EXPECT_EQ(*store.Get("rank/0", kTimeout), "x");
}

TEST(FileKeyValueStoreTest, FailedRenameLeavesNoTemporaryFile) {
  TempDir dir;
  FaultyFileSystem faulty;
  FileKeyValueStore store(dir.path(), absl::Milliseconds(5), &faulty);
  faulty.FailRename(1);
  const absl::Status failed = store.Set("key", "value");
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_THAT(Names(dir.path()), IsEmpty());
}

}  // namespace
}  // namespace recps::worker

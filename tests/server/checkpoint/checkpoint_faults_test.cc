// Checkpoint files under injected faults (faulty_file_system.h): a full
// disk, a torn or failed manifest write, a slow fsync, a failed rename in an
// export. No root and no tmpfs: the faults come through the FileSystem seam.
// The row files are RocksDB's and do not see these faults (a really full
// disk under them: checkpoint_test.cc, DiskFullIsResourceExhausted...).
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/wire/shard_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/checkpoint/chain.h"
#include "server/checkpoint/checkpoint.h"
#include "server/checkpoint/export.h"
#include "server/checkpoint/manifest.h"
#include "server/store/embedding_store.h"
#include "tests/server/checkpoint/faulty_file_system.h"
#include "tests/testing/files.h"
#include "tests/testing/table_specs.h"

namespace recps::server::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::recps::testing::FaultyFileSystem;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint32_t kSlots = 16;
constexpr char kDigest[] = "00000000000000bb";
constexpr int kRows = 200;

std::vector<uint32_t> AllSlots() {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < kSlots; ++s) out.push_back(s);
  return out;
}

std::unique_ptr<EmbeddingStore> MakeStore() {
  StoreOptions o;
  o.seed = 5;
  o.num_slots = kSlots;
  o.max_rows_per_table = 1 << 12;
  auto store = CreateHostEmbeddingStore({testing::TestTableSpec("emb", 8)}, o);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// Every file under `root` whose name ends in ".tmp": a write that failed
// must not leave one.
std::vector<std::string> TempFilesUnder(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (absl::EndsWith(it->path().string(), ".tmp")) {
      out.push_back(it->path().string());
    }
  }
  return out;
}

class CheckpointFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(
        ::testing::TempDir(), "/ckpt_faults_", getpid(), "_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    source_ = MakeStore();
    ASSERT_NE(source_, nullptr);
    std::vector<int64_t> ids(kRows);
    for (int i = 0; i < kRows; ++i) ids[i] = 1000 + 7 * i;
    std::vector<float> out(ids.size() * 8);
    ASSERT_TRUE(source_->Lookup(0, ids, out.data()).ok());  // creates the rows
  }
  void TearDown() override { fs::remove_all(root_); }

  absl::StatusOr<CheckpointInfo> Write(uint64_t step) {
    CheckpointSpec spec;
    spec.step = step;
    spec.job_config_digest = kDigest;
    spec.shard_map = ShardMap::Uniform(1, kSlots, {"a:1"}).ToProto();
    const std::vector<ShardRows> shards = {{source_.get(), AllSlots()}};
    return WriteCheckpoint(root_, spec, shards, {}, &faulty_);
  }

  std::vector<uint64_t> ListedSteps() {
    absl::StatusOr<std::vector<CheckpointInfo>> list =
        ListCheckpoints(root_, &faulty_);
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<uint64_t> steps;
    if (list.ok()) {
      for (const CheckpointInfo& c : *list) steps.push_back(c.step);
    }
    return steps;
  }

  std::string StepDir(uint64_t step) const {
    return absl::StrCat(root_, "/", CheckpointDirName(step));
  }

  FaultyFileSystem faulty_;
  std::string root_;
  std::unique_ptr<EmbeddingStore> source_;
};

TEST(FaultyFileSystemTest, AFullDiskWritesWhatFitsThenFailsEveryWrite) {
  testing::TempDir dir;
  FaultyFileSystem faulty;
  faulty.SetDiskFullAfter(10);
  EXPECT_TRUE(faulty.WriteFile(dir.path() + "/a", "123456", true).ok());
  const absl::Status s = faulty.WriteFile(dir.path() + "/b", "abcdefgh", true);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr(dir.path() + "/b"));
  EXPECT_EQ(testing::ReadAll(dir.path() + "/b"), "abcd");
  EXPECT_EQ(faulty.WriteFile(dir.path() + "/c", "x", false).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(faulty.WriteFile(dir.path() + "/d", "", false).ok());
  faulty.SetDiskFullAfter(-1);
  EXPECT_TRUE(faulty.WriteFile(dir.path() + "/c", "x", false).ok());
  EXPECT_EQ(faulty.bytes_written(), 6 + 4 + 1);
}

TEST(FaultyFileSystemTest, ATornWriteLeavesItsPrefixAndFailsOnce) {
  testing::TempDir dir;
  FaultyFileSystem faulty;
  faulty.TearWrite(2, 3);
  EXPECT_TRUE(faulty.WriteFile(dir.path() + "/a", "whole", false).ok());
  const absl::Status s = faulty.WriteFile(dir.path() + "/b", "torn!", true);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(testing::ReadAll(dir.path() + "/b"), "tor");
  EXPECT_TRUE(faulty.WriteFile(dir.path() + "/c", "whole", false).ok());
  EXPECT_EQ(testing::ReadAll(dir.path() + "/c"), "whole");
}

TEST(FaultyFileSystemTest, TheKthRenameFailsAndRenamesNothing) {
  testing::TempDir dir;
  FaultyFileSystem faulty;
  const std::string a = dir.WriteFile("a", "x");
  faulty.FailRename(2);
  EXPECT_TRUE(faulty.Rename(a, dir.path() + "/b").ok());
  EXPECT_EQ(faulty.Rename(dir.path() + "/b", dir.path() + "/c").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(fs::exists(dir.path() + "/b"));
  EXPECT_TRUE(faulty.Rename(dir.path() + "/b", dir.path() + "/c").ok());
  EXPECT_EQ(faulty.renames(), 3);
}

TEST_F(CheckpointFaultsTest, AFullDiskAtTheManifestIsResourceExhaustedAndThePreviousOneLists) {
  ASSERT_TRUE(Write(10).ok());
  // The row file (RocksDB) still fits; the manifest's bytes do not.
  faulty_.SetDiskFullAfter(16);
  absl::StatusOr<CheckpointInfo> second = Write(20);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted)
      << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr(StepDir(20) + "/" + kManifestName));
  EXPECT_FALSE(fs::exists(StepDir(20)));
  EXPECT_THAT(TempFilesUnder(root_), IsEmpty());
  EXPECT_EQ(ListedSteps(), std::vector<uint64_t>{10});
  // And it still restores, its manifest read through the same seam.
  faulty_.SetDiskFullAfter(-1);
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  absl::StatusOr<RestoreStats> stats = RestoreCheckpoint(
      StepDir(10), kDigest, *target, AllSlots(), {}, &faulty_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->rows, kRows);
}

TEST_F(CheckpointFaultsTest, ATornManifestWriteLeavesNoCheckpointAndNoTempFile) {
  faulty_.TearWrite(1, 12);  // the manifest is the only file written by fs
  absl::StatusOr<CheckpointInfo> info = Write(20);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable)
      << info.status();
  EXPECT_THAT(info.status().message(), HasSubstr(StepDir(20)));
  EXPECT_FALSE(fs::exists(StepDir(20)));
  EXPECT_THAT(TempFilesUnder(root_), IsEmpty());
  EXPECT_THAT(ListedSteps(), IsEmpty());
  // The next try writes it.
  ASSERT_TRUE(Write(20).ok());
  EXPECT_EQ(ListedSteps(), std::vector<uint64_t>{20});
}

TEST_F(CheckpointFaultsTest, ATornManifestReplacementKeepsTheOldManifest) {
  // What compaction's manifest swap relies on: the old one stays whole.
  absl::StatusOr<CheckpointInfo> info = Write(10);
  ASSERT_TRUE(info.ok()) << info.status();
  v1::CheckpointManifest changed = info->manifest;
  changed.set_reason("changed");
  faulty_.TearWrite(1, 30);
  EXPECT_EQ(WriteManifest(info->dir, changed, &faulty_).code(),
            absl::StatusCode::kUnavailable);
  absl::StatusOr<v1::CheckpointManifest> read =
      ReadManifest(info->dir, &faulty_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), info->manifest.SerializeAsString());
  EXPECT_THAT(TempFilesUnder(root_), IsEmpty());
}

TEST_F(CheckpointFaultsTest, AFailedManifestRenameLeavesNoCheckpointAndNoTempFile) {
  ASSERT_TRUE(Write(10).ok());
  faulty_.FailRename(1);
  absl::StatusOr<CheckpointInfo> info = Write(20);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable)
      << info.status();
  EXPECT_FALSE(fs::exists(StepDir(20)));
  EXPECT_THAT(TempFilesUnder(root_), IsEmpty());
  EXPECT_EQ(ListedSteps(), std::vector<uint64_t>{10});
}

TEST_F(CheckpointFaultsTest, ASlowFsyncOnlySlowsTheWrite) {
  constexpr absl::Duration kDelay = absl::Milliseconds(40);
  faulty_.SetFsyncDelay(kDelay);
  const absl::Time start = absl::Now();
  absl::StatusOr<CheckpointInfo> info = Write(10);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(info.ok()) << info.status();
  // The row files' directory, the manifest, its directory, the root.
  EXPECT_GE(faulty_.fsyncs(), 4);
  EXPECT_GE(took, kDelay * faulty_.fsyncs());
  EXPECT_EQ(ListedSteps(), std::vector<uint64_t>{10});
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(info->dir, kDigest, *target, AllSlots(), {}, &faulty_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->rows, kRows);
}

TEST_F(CheckpointFaultsTest, AnExportWhoseMetaFileFailsIsIncomplete) {
  ASSERT_TRUE(Write(10).ok());
  absl::StatusOr<std::vector<CheckpointInfo>> chain =
      ResolveChain(root_, std::nullopt, &faulty_);
  ASSERT_TRUE(chain.ok()) << chain.status();
  const std::string out = root_ + "/export/emb";
  ExportOptions options;
  options.fs = &faulty_;
  faulty_.FailRename(3);  // ids, weights, then meta.json
  absl::StatusOr<ExportResult> result = ExportTable(*chain, "emb", out, options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
      << result.status();
  EXPECT_TRUE(fs::exists(out + "/emb.ids"));
  EXPECT_TRUE(fs::exists(out + "/emb.weights"));
  EXPECT_FALSE(fs::exists(out + "/emb.meta.json"));  // absent: incomplete
  EXPECT_THAT(TempFilesUnder(out), IsEmpty());
  result = ExportTable(*chain, "emb", out, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->rows, kRows);
}

}  // namespace
}  // namespace recps::server::checkpoint

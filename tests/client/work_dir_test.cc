// The work directory of `recps local` (client/launcher/work_dir.h): made
// with the job's copy, and a clear error naming the path on a full disk
// (through the faulty file system: no root, no tmpfs).
#include "client/launcher/work_dir.h"

#include <string>

#include "absl/status/status.h"
#include "common/file_system.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/checkpoint/faulty_file_system.h"
#include "tests/testing/files.h"

namespace recps::client {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

constexpr char kJob[] = "training { steps: 10 }\n";

TEST(PrepareWorkDirTest, MakesTheDirectoryAndTheJobCopy) {
  recps::testing::TempDir dir;
  const std::string work = dir.path() + "/a/b/work";
  absl::StatusOr<WorkDir> made =
      PrepareWorkDir(work, kJob, FileSystem::Default());
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->dir, work);
  EXPECT_EQ(made->job_copy, work + "/job.textproto");
  EXPECT_EQ(recps::testing::ReadAll(made->job_copy), kJob);
}

TEST(PrepareWorkDirTest, WithoutOneMakesANewTemporaryDirectory) {
  absl::StatusOr<WorkDir> made =
      PrepareWorkDir("", kJob, FileSystem::Default());
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_THAT(made->dir, StartsWith("/tmp/recps-local-"));
  EXPECT_EQ(recps::testing::ReadAll(made->job_copy), kJob);
  EXPECT_TRUE(FileSystem::Default()->RemoveTree(made->dir).ok());
}

TEST(PrepareWorkDirTest, FullDiskFailsNamingTheJobCopyAndLeavesNoHalfJob) {
  recps::testing::TempDir dir;
  recps::testing::FaultyFileSystem faulty;
  faulty.SetDiskFullAfter(5);
  absl::StatusOr<WorkDir> made = PrepareWorkDir(dir.path(), kJob, &faulty);
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(made.status())) << made.status();
  const std::string message(made.status().message());
  EXPECT_THAT(message, HasSubstr(dir.path() + "/job.textproto"));
  EXPECT_THAT(message, HasSubstr("--work_dir"));
  EXPECT_THAT(message, HasSubstr("No space left"));
  EXPECT_THAT(*FileSystem::Default()->ListDir(dir.path()), IsEmpty());
}

TEST(PrepareWorkDirTest, AFileInTheWayNamesTheWorkDirectory) {
  recps::testing::TempDir dir;
  const std::string file = dir.WriteFile("work", "not a directory");
  absl::StatusOr<WorkDir> made =
      PrepareWorkDir(file + "/sub", kJob, FileSystem::Default());
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(made.status())) << made.status();
  EXPECT_THAT(std::string(made.status().message()), HasSubstr(file));
}

}  // namespace
}  // namespace recps::client

// The port file (common/port_file.h): written whole or not at all, also on
// a full disk (through the faulty file system: no root, no tmpfs).
#include "common/port_file.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/file_system.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/checkpoint/faulty_file_system.h"
#include "tests/testing/files.h"

namespace recps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Names(const std::string& dir) {
  absl::StatusOr<std::vector<FileSystem::DirEntry>> entries =
      FileSystem::Default()->ListDir(dir);
  std::vector<std::string> names;
  for (const FileSystem::DirEntry& e : *entries) names.push_back(e.name);
  return names;
}

TEST(PortFileTest, HoldsBothPorts) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/ports";
  ASSERT_TRUE(WritePortFile(path, 40123, 9100).ok());
  EXPECT_EQ(testing::ReadAll(path), "40123 9100\n");
  EXPECT_THAT(Names(dir.path()), ElementsAre("ports"));
}

TEST(PortFileTest, FullDiskFailsNamingTheFileAndLeavesNone) {
  testing::TempDir dir;
  testing::FaultyFileSystem faulty;
  const std::string path = dir.path() + "/ports";
  faulty.SetDiskFullAfter(3);
  const absl::Status s = WritePortFile(path, 40123, 9100, &faulty);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_THAT(Names(dir.path()), ::testing::IsEmpty());  // no port, no .tmp
}

TEST(PortFileTest, FailedRewriteKeepsTheEarlierFileWhole) {
  testing::TempDir dir;
  testing::FaultyFileSystem faulty;
  const std::string path = dir.path() + "/ports";
  ASSERT_TRUE(WritePortFile(path, 1, 2, &faulty).ok());
  faulty.TearWrite(1, 2);
  EXPECT_TRUE(absl::IsUnavailable(WritePortFile(path, 40123, 9100, &faulty)));
  EXPECT_EQ(testing::ReadAll(path), "1 2\n");
  EXPECT_THAT(Names(dir.path()), ElementsAre("ports"));
}

}  // namespace
}  // namespace recps

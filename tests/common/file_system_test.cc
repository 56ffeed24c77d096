// Tests of the POSIX FileSystem (common/file_system.h): what it does and
// the status codes errno turns into, each naming the path.
#include "common/file_system.h"

#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"

namespace recps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FileSystemTest : public ::testing::Test {
 protected:
  FileSystem* fs_ = FileSystem::Default();
  testing::TempDir dir_;
  std::string Path(const std::string& name) const {
    return dir_.path() + "/" + name;
  }
};

TEST_F(FileSystemTest, ErrnoStatusPicksTheCodeByWhatTheCallerShouldDo) {
  const struct {
    int err;
    absl::StatusCode code;
  } cases[] = {{ENOENT, absl::StatusCode::kNotFound},
               {EACCES, absl::StatusCode::kPermissionDenied},
               {EPERM, absl::StatusCode::kPermissionDenied},
               {EROFS, absl::StatusCode::kPermissionDenied},
               {ENOSPC, absl::StatusCode::kResourceExhausted},
               {EDQUOT, absl::StatusCode::kResourceExhausted},
               {ENOTDIR, absl::StatusCode::kFailedPrecondition},
               {EEXIST, absl::StatusCode::kFailedPrecondition},
               {EISDIR, absl::StatusCode::kFailedPrecondition},
               {EIO, absl::StatusCode::kUnavailable}};
  for (const auto& c : cases) {
    const absl::Status s = ErrnoStatus(c.err, "cannot frob", "/a/b");
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr("cannot frob /a/b: "));
    EXPECT_THAT(s.message(), HasSubstr(std::strerror(c.err)));
  }
}

TEST_F(FileSystemTest, WriteFileAtomicallyReplacesTheFileAndLeavesNoTemp) {
  ASSERT_TRUE(fs_->WriteFileAtomically(Path("f"), "first").ok());
  ASSERT_TRUE(fs_->WriteFileAtomically(Path("f"), "second").ok());
  absl::StatusOr<std::string> got = fs_->ReadSmallFile(Path("f"), 100);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "second");
  absl::StatusOr<std::vector<FileSystem::DirEntry>> list =
      fs_->ListDir(dir_.path());
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "f");
}

TEST_F(FileSystemTest, FailedAtomicWriteLeavesTheTargetAndNoTemp) {
  // The rename fails: a directory is in the way.
  ASSERT_TRUE(fs_->CreateDir(Path("d")).ok());
  ASSERT_TRUE(fs_->WriteFile(Path("d/x"), "x", false).ok());
  const absl::Status s = fs_->WriteFileAtomically(Path("d"), "bytes");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(Path("d.tmp")));
  EXPECT_FALSE(std::filesystem::exists(Path("d.tmp")));
  EXPECT_TRUE(std::filesystem::is_directory(Path("d")));
}

TEST_F(FileSystemTest, MissingPathsAreNotFoundNamingThem) {
  const std::string missing = Path("missing");
  for (const absl::Status& s :
       {fs_->ReadSmallFile(missing, 10).status(), fs_->ListDir(missing).status(),
        fs_->SyncDir(missing), fs_->RemoveFile(missing),
        fs_->CreateDir(missing + "/sub"),
        fs_->Rename(missing, Path("other"))}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), HasSubstr(missing));
  }
  EXPECT_TRUE(fs_->RemoveTree(missing).ok());
}

TEST_F(FileSystemTest, APathThroughARegularFileIsFailedPrecondition) {
  const std::string file = dir_.WriteFile("plain", "not a directory");
  for (const absl::Status& s :
       {fs_->ReadSmallFile(file + "/x", 10).status(),
        fs_->ListDir(file).status(), fs_->CreateDir(file + "/x"),
        fs_->CreateDirs(file + "/x/y"), fs_->CreateDir(file),
        fs_->WriteFile(file + "/x", "b", false)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr(file));
  }
  EXPECT_EQ(fs_->ReadSmallFile(dir_.path(), 10).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(FileSystemTest, AFileOverTheLimitIsRefusedNamingBoth) {
  const std::string file = dir_.WriteFile("big", std::string(100, 'x'));
  const absl::Status s = fs_->ReadSmallFile(file, 99).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("100 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("limit of 99"));
  EXPECT_TRUE(fs_->ReadSmallFile(file, 100).ok());
}

TEST_F(FileSystemTest, AFullDeviceIsResourceExhausted) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full";
  const absl::Status s = fs_->WriteFile("/dev/full", "bytes", /*sync=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("/dev/full"));
}

// The writes a read-only directory refuses; an empty string when each was
// PERMISSION_DENIED naming the path, else what went wrong.
std::string ReadOnlyDirRefusals(FileSystem* fs, const std::string& ro) {
  std::string wrong;
  for (const absl::Status& s :
       {fs->WriteFile(ro + "/f", "x", false), fs->CreateDir(ro + "/sub"),
        fs->WriteFileAtomically(ro + "/g", "x")}) {
    if (s.code() != absl::StatusCode::kPermissionDenied ||
        s.message().find(ro) == absl::string_view::npos) {
      wrong += s.ToString() + "; ";
    }
  }
  return wrong;
}

TEST_F(FileSystemTest, AReadOnlyDirectoryIsPermissionDenied) {
  const std::string ro = Path("ro");
  ASSERT_TRUE(fs_->CreateDir(ro).ok());
  ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
  if (geteuid() != 0) {
    EXPECT_EQ(ReadOnlyDirRefusals(fs_, ro), "");
    return;
  }
  // Root writes anywhere: the check runs in a child that drops to nobody.
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
    _exit(ReadOnlyDirRefusals(fs_, ro).empty() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "root cannot become nobody";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a write into " << ro
                                    << " was not PERMISSION_DENIED";
}

TEST_F(FileSystemTest, CreateDirsMakesEveryMissingParentAndAcceptsExisting) {
  ASSERT_TRUE(fs_->CreateDirs(Path("a/b//c/")).ok());
  EXPECT_TRUE(std::filesystem::is_directory(Path("a/b/c")));
  EXPECT_TRUE(fs_->CreateDirs(Path("a/b/c")).ok());
  EXPECT_TRUE(fs_->CreateDir(Path("a")).ok());
}

TEST_F(FileSystemTest, ListDirSortsByNameAndTellsDirectories) {
  ASSERT_TRUE(fs_->CreateDir(Path("b_dir")).ok());
  dir_.WriteFile("a_file", "x");
  dir_.WriteFile("c_file", "x");
  std::filesystem::create_directory_symlink(Path("b_dir"), Path("d_link"));
  absl::StatusOr<std::vector<FileSystem::DirEntry>> list =
      fs_->ListDir(dir_.path());
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<std::string> names;
  std::vector<bool> dirs;
  for (const FileSystem::DirEntry& e : *list) {
    names.push_back(e.name);
    dirs.push_back(e.is_dir);
  }
  EXPECT_THAT(names, ElementsAre("a_file", "b_dir", "c_file", "d_link"));
  EXPECT_THAT(dirs, ElementsAre(false, true, false, true));
}

TEST_F(FileSystemTest, RemoveTreeRemovesEverythingUnderIt) {
  ASSERT_TRUE(fs_->CreateDirs(Path("t/u/v")).ok());
  ASSERT_TRUE(fs_->WriteFile(Path("t/u/v/f"), "x", false).ok());
  ASSERT_TRUE(fs_->WriteFile(Path("t/g"), "x", false).ok());
  ASSERT_TRUE(fs_->RemoveTree(Path("t")).ok());
  EXPECT_FALSE(std::filesystem::exists(Path("t")));
  ASSERT_TRUE(fs_->WriteFile(Path("f"), "x", true).ok());
  ASSERT_TRUE(fs_->RemoveFile(Path("f")).ok());
  EXPECT_FALSE(std::filesystem::exists(Path("f")));
}

}  // namespace
}  // namespace recps

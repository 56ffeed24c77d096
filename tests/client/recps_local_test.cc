// `recps local` end to end: it starts a coordinator, shard servers and
// workers, trains, and stops everything; Ctrl-C stops it cleanly too.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_shard.h"

extern char** environ;

namespace recps {
namespace {

std::string Job() { return std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto"; }

TEST(RecpsLocal, TrainsWithTwoShardsAndTwoWorkers) {
  testing::TempDir dir;
  absl::StatusOr<int> code = testing::RunProcess(
      RECPS_LAUNCHER_BINARY,
      {"local", "--job=" + Job(), "--shards=2", "--workers=2", "--steps=60",
       "--work_dir=" + dir.path()},
      absl::Minutes(4));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

TEST(RecpsLocal, BadJobIsRefusedBeforeAnythingStarts) {
  testing::TempDir dir;
  const std::string job = dir.WriteFile("bad.textproto", "tables { name: \"t\" dim: 0 }\n");
  absl::StatusOr<int> code = testing::RunProcess(
      RECPS_LAUNCHER_BINARY, {"local", "--job=" + job}, absl::Minutes(1));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);
}

TEST(RecpsLocal, InterruptStopsTheCluster) {
  testing::TempDir dir;
  std::vector<std::string> args = {RECPS_LAUNCHER_BINARY, "local", "--job=" + Job(),
                                   "--steps=100000", "--work_dir=" + dir.path()};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, args[0].c_str(), nullptr, nullptr, argv.data(), environ), 0);
  absl::SleepFor(absl::Seconds(4));
  kill(pid, SIGINT);
  int status = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (waitpid(pid, &status, WNOHANG) != pid) {
    ASSERT_LT(absl::Now(), deadline) << "recps local did not stop after SIGINT";
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
}

}  // namespace
}  // namespace recps

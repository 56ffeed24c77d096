// Child processes: exit codes, logs, bad binaries, and that a child dies
// with the thread that spawned it (no servers left behind by a crash).
#include "client/launcher/process.h"

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_shard.h"

namespace recps::client {
namespace {

using ::testing::HasSubstr;

TEST(ChildProcessTest, ExitCodeLogAndEnvironment) {
  recps::testing::TempDir dir;
  const std::string log = dir.path() + "/child.log";
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(
      "/bin/sh", {"-c", "echo \"hello $RECPS_TEST_VAR\"; echo oops >&2; exit 3"}, log,
      {"RECPS_TEST_VAR=world"});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> code = child->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3);
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("hello world"));
  EXPECT_THAT(text.str(), HasSubstr("oops"));
}

TEST(ChildProcessTest, MissingBinaryIsNotFoundNamingIt) {
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn("/nonexistent/recps-x", {});
  ASSERT_FALSE(child.ok());
  EXPECT_TRUE(absl::IsNotFound(child.status())) << child.status();
  EXPECT_THAT(child.status().message(), HasSubstr("/nonexistent/recps-x"));
}

TEST(ChildProcessTest, StopEndsALongRunningChild) {
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn("/bin/sleep", {"60"});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_FALSE(child->Poll().ok());
  absl::StatusOr<int> code = child->Stop(absl::Seconds(5));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + SIGTERM);
}

TEST(SpawnProcessTest, ChildDiesWithTheThreadThatSpawnedIt) {
  absl::StatusOr<pid_t> pid;
  std::thread spawner([&] { pid = SpawnProcess("/bin/sleep", {"60"}); });
  spawner.join();  // the spawning thread is gone: the kernel kills the child
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

}  // namespace
}  // namespace recps::client

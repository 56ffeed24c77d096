// `--help` of every recps binary lists the binary's own flags (absl's
// default matched none of them: "No flags matched").
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/launcher/process.h"
#include "gtest/gtest.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

struct Binary {
  const char* path;
  const char* own_flag;  // one flag its main file defines
};

TEST(HelpFlags, EveryBinaryListsItsOwnFlags) {
  const std::vector<Binary> binaries = {
      {RECPS_LAUNCHER_BINARY, "--shards"},
      {RECPS_WORKER_BINARY, "--memory_limit"},
      {RECPS_SHARD_BINARY, "--max_ids_per_request"},
      {RECPS_COORDINATOR_BINARY, "--state_dir"},
      {RECPSCTL_BINARY, "--coordinator"},
  };
  for (const Binary& b : binaries) {
    testing::TempDir dir;
    const std::string log = dir.path() + "/help.txt";
    absl::StatusOr<pid_t> pid = client::SpawnProcess(b.path, {"--help"}, log);
    ASSERT_TRUE(pid.ok()) << pid.status();
    int status = 0;
    ASSERT_TRUE(testing::Eventually(
        [&] { return waitpid(*pid, &status, WNOHANG) == *pid; }, absl::Seconds(30)))
        << b.path;
    ASSERT_TRUE(WIFEXITED(status)) << b.path;
    std::string help;
    {
      std::FILE* f = std::fopen(log.c_str(), "r");
      ASSERT_NE(f, nullptr);
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) help.append(buf, n);
      std::fclose(f);
    }
    EXPECT_NE(help.find(b.own_flag), std::string::npos) << b.path << ":\n" << help;
    EXPECT_EQ(help.find("No flags matched"), std::string::npos) << b.path << ":\n" << help;
  }
}

}  // namespace
}  // namespace recps

// recps-shard --device=cuda:N as a real process: without a usable GPU it
// exits at start naming the device and why; with one it serves the same
// rows as a --device=cpu server.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/embedding_client.h"
#include "client/launcher/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda_util.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testing::LocalShard;
using testing::TempDir;

constexpr int kDim = 8;
constexpr char kTables[] = R"(
tables {
  name: "user"
  dim: 8
  optimizer { kind: ADAGRAD learning_rate: 0.1 }
}
)";

// Runs recps-shard with `args` to its exit (at most 30 s); its output goes
// to `log`. Returns the exit code, -1 when it did not exit in time.
int RunShardToExit(const TempDir& dir, std::vector<std::string> args,
                   std::string* log) {
  const std::string log_path = dir.path() + "/exit.log";
  args.push_back("--insecure");
  absl::StatusOr<pid_t> pid =
      client::SpawnProcess(RECPS_SHARD_BINARY, args, log_path);
  EXPECT_TRUE(pid.ok()) << pid.status();
  if (!pid.ok()) return -1;
  int status = 0;
  const bool exited = testing::Eventually(
      [&] { return waitpid(*pid, &status, WNOHANG) == *pid; }, absl::Seconds(30));
  if (!exited) {
    kill(*pid, SIGKILL);
    waitpid(*pid, nullptr, 0);
    return -1;
  }
  std::ifstream in(log_path);
  log->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(DeviceStoreProcess, CudaWithoutAUsableGpuExitsAtStartNamingWhy) {
  const absl::StatusOr<int> gpus = kernels::CudaDeviceCount();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  TempDir dir;
  // cuda:<number of GPUs> is refused on every machine: here (no GPU) as
  // cuda:0 with no driver or no GPU, on a GPU machine as out of range.
  const std::string device = absl::StrCat("cuda:", *gpus);
  std::string log;
  const int code = RunShardToExit(
      dir,
      {"--tables=" + dir.WriteFile("t.textproto", kTables), "--standalone",
       "--max_rows_per_table=1000", "--device=" + device},
      &log);
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, HasSubstr(absl::StrCat("device ", device, ": "))) << log;
  EXPECT_THAT(log, AnyOf(HasSubstr("no CUDA GPU"), HasSubstr("NVIDIA driver"),
                         HasSubstr("out of range"), HasSubstr("has no CUDA"),
                         HasSubstr("cannot initialise")))
      << log;
}

TEST(DeviceStoreProcess, GpuShardServesTheRowsOfACpuShard) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  TempDir dir;
  const std::string tables = "--tables=" + dir.WriteFile("t.textproto", kTables);
  std::vector<std::vector<float>> rows;
  for (const char* device : {"--device=cuda:0", "--device=cpu"}) {
    auto shard = LocalShard::Start(
        RECPS_SHARD_BINARY,
        {tables, "--standalone", "--max_rows_per_table=100000", device});
    ASSERT_TRUE(shard.ok()) << shard.status();
    client::EmbeddingClientOptions options;
    options.rpc_timeout = absl::Seconds(30);
    auto c = client::EmbeddingClient::Create(
        {{"user", kDim}}, client::MakeServerShardMapSource({(*shard)->address()}),
        options);
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<int64_t> ids(5000);
    for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int64_t>(k * 7);
    std::vector<float> out(ids.size() * kDim);
    ASSERT_TRUE((*c)->Lookup(0, {{{0, ids, out.data()}}}).ok());
    rows.push_back(std::move(out));
    auto code = (*shard)->Terminate();
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
  }
  EXPECT_EQ(rows[0], rows[1]);
}

}  // namespace
}  // namespace recps

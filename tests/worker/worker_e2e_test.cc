// End to end: a real recps-shard process and one or two real recps-worker
// processes train the small example job (800 steps of 512 samples per
// worker) on synthetic data; the model must learn, in every consistency
// mode, with the staleness the mode allows.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/launcher/process.h"
#include "common/cpu_features.h"
#include "gtest/gtest.h"
#include "kernels/cuda_util.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/gpu_test_util.h"

namespace recps {
namespace {

// The "auc" values of the worker's result JSON, in order.
std::vector<double> Aucs(const std::string& json) {
  std::vector<double> out;
  for (size_t pos = json.find("\"auc\":"); pos != std::string::npos;
       pos = json.find("\"auc\":", pos + 1)) {
    out.push_back(std::stod(json.substr(pos + 6)));
  }
  return out;
}

// Bounded mode's staleness bound in TrainTwo: 1, so that async mode (whose
// staleness the dense allreduce keeps at 2 or less, see below) can exceed it.
constexpr int kStaleness = 1;

// One worker's run: its held-out AUCs and the most steps of pushes its
// training lookups missed (the result JSON's max_lookup_staleness_steps).
struct WorkerRun {
  std::vector<double> aucs;
  int64_t max_staleness = -2;  // -2: not in the JSON
};

// Trains the small example (800 steps) in `mode` (BOUNDED: staleness
// kStaleness) with one shard server and two workers that allreduce their
// dense gradients (each one compute thread).
std::vector<WorkerRun> TrainTwo(const std::string& mode) {
  testing::TempDir dir;
  std::string job_text = ::recps::testing::ReadAll(std::string(RECPS_SOURCE_DIR) +
                                                   "/examples/small.textproto");
  const std::string sync = "consistency { mode: SYNC }";
  job_text.replace(job_text.find(sync), sync.size(),
                   absl::StrCat("consistency { mode: ", mode, " staleness: ", kStaleness, " }"));
  const std::string job = dir.WriteFile("job.textproto", job_text);
  auto shard = testing::LocalShard::Start(
      RECPS_SHARD_BINARY, {"--job=" + job, "--standalone", "--world_size=2"});
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return {};
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      absl::StatusOr<int> code = testing::RunProcess(
          RECPS_WORKER_BINARY,
          {"--config=" + job, "--shards=" + (*shard)->address(), absl::StrCat("--rank=", r),
           "--world_size=2", "--steps=800", "--threads=1",
           "--rendezvous_dir=" + dir.path() + "/rendezvous",
           absl::StrCat("--result_json=", dir.path(), "/result", r, ".json")},
          absl::Minutes(5));
      EXPECT_TRUE(code.ok() && *code == 0) << mode << " rank " << r << ": " << code.status();
    });
  }
  for (std::thread& w : workers) w.join();
  std::vector<WorkerRun> runs(2);
  for (int r = 0; r < 2; ++r) {
    const std::string json =
        ::recps::testing::ReadAll(absl::StrCat(dir.path(), "/result", r, ".json"));
    runs[r].aucs = Aucs(json);
    const std::string key = "\"max_lookup_staleness_steps\":";
    const size_t at = json.find(key);
    if (at != std::string::npos) runs[r].max_staleness = std::stoll(json.substr(at + key.size()));
  }
  return runs;
}

// Runs `binary` with `args` to completion (killed after `timeout`); returns
// its exit code (128 + signal when killed) and its output in `*output`.
int RunCapturing(const std::string& binary, const std::vector<std::string>& args,
                 absl::Duration timeout, std::string* output) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/output.log";
  std::vector<std::string> with_security = args;
  with_security.push_back("--insecure");  // the test's shard servers are plaintext
  absl::StatusOr<pid_t> pid = client::SpawnProcess(binary, with_security, log);
  if (!pid.ok()) {
    *output = pid.status().ToString();
    return -1;
  }
  int status = 0;
  const bool exited = testing::Eventually(
      [&] { return waitpid(*pid, &status, WNOHANG) == *pid; }, timeout);
  if (!exited) {
    kill(*pid, SIGKILL);
    waitpid(*pid, &status, 0);
  }
  *output = ::recps::testing::ReadAll(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The small example with `edit` applied to its text.
std::string SmallJobWith(const testing::TempDir& dir, const std::string& from,
                         const std::string& to) {
  std::string text = ::recps::testing::ReadAll(std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto");
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return dir.WriteFile("job.textproto", text);
}

// Sizes beyond their bounds, and jobs that do not fit the machine, stop the
// worker at start with the setting to lower (they used to pass and die with
// std::bad_alloc once the shard server answered).
TEST(WorkerEndToEnd, OversizedJobsAreRefusedNamingTheSetting) {
  // The same tables as every case's job.
  auto shard = testing::LocalShard::Start(
      RECPS_SHARD_BINARY,
      {"--job=" + std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto",
       "--standalone", "--world_size=1"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  struct Case {
    std::string from, to;
    std::vector<std::string> flags;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"batch_size: 512", "batch_size: 2000000000", {}, "training.batch_size: is 2000000000"},
      {"bottom_mlp: [64, 16]", "bottom_mlp: [2000000000, 16]", {},
       "model.bottom_mlp[0]: is 2000000000"},
      {"max_ids_per_bag: 3", "max_ids_per_bag: 2000000000", {},
       "data.synthetic.features[0].max_ids_per_bag: is 2000000000"},
      // Within every bound but some TiB of dense model: more than any
      // machine here has available.
      {"top_mlp: [64, 32, 1]", "top_mlp: [65536, 65536, 65536, 65536, 65536, 65536, 1]",
       {}, "lower model.bottom_mlp / model.top_mlp widths"},
      // Fits the machine, not the limit given.
      {"batch_size: 512", "batch_size: 1048576", {"--memory_limit=1G"},
       "but --memory_limit=1G is 1.00 GiB; lower training.batch_size"},
  };
  for (const Case& c : cases) {
    testing::TempDir dir;
    const std::string job = SmallJobWith(dir, c.from, c.to);
    std::vector<std::string> args = {"--config=" + job, "--shards=" + (*shard)->address()};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    std::string output;
    const int code = RunCapturing(RECPS_WORKER_BINARY, args, absl::Seconds(60), &output);
    EXPECT_EQ(code, 2) << c.to << "\n" << output;
    EXPECT_NE(output.find(c.expected), std::string::npos) << c.to << "\n" << output;
    EXPECT_EQ(output.find("bad_alloc"), std::string::npos) << output;
  }
}

// --device=cuda where no GPU can run stops the worker at start (before it
// registers or connects anywhere) with exit code 2 and the reason; a device
// name that is not one is refused the same way.
TEST(WorkerEndToEnd, CudaDeviceWithoutAGpuExitsTwoNamingTheDevice) {
  RECPS_REQUIRE_NO_GPU_OR_SKIP();
  const std::string job = std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto";
  struct Case {
    std::string device, expected;
  };
  const std::vector<Case> cases = {
#if RECPS_HAVE_CUDA
      {"cuda", "--device=cuda: device cuda:0: no CUDA device is visible"},
      {"cuda:1", "--device=cuda:1: device cuda:1: no CUDA device is visible"},
#else
      {"cuda", "--device=cuda: device cuda:0: this build has no CUDA"},
#endif
      {"tpu", "--device: device 'tpu': expected cpu, cuda or cuda:N"},
  };
  for (const Case& c : cases) {
    std::string output;
    // No shard server listens there: the worker must stop before it looks.
    const int code = RunCapturing(
        RECPS_WORKER_BINARY,
        {"--config=" + job, "--shards=127.0.0.1:1", "--device=" + c.device},
        absl::Seconds(60), &output);
    EXPECT_EQ(code, 2) << c.device << "\n" << output;
    EXPECT_NE(output.find(c.expected), std::string::npos) << c.device << "\n" << output;
  }
}

// OpenBLAS's AVX-512 kernels wherever the CPU runs AVX-512, although the
// environment pins an AVX2 core (machines here export
// OPENBLAS_CORETYPE=Haswell, which halved the worker's GEMM rate on AMD Zen
// 5): the worker re-executes itself with OPENBLAS_CORETYPE=SkylakeX and says
// so; --blas_kernels=env keeps the environment's core.
TEST(WorkerEndToEnd, BlasKernelsFollowTheCpuNotAPinnedEnvironment) {
  const char* saved = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  const std::string job = std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto";
  auto run = [&](const std::string& mode, std::string* output) {
    return RunCapturing(RECPS_WORKER_BINARY,
                        {"--config=" + job, "--embedded_shard", "--steps=3", "--threads=1",
                         "--blas_kernels=" + mode},
                        absl::Seconds(60), output);
  };
  std::string output;
  EXPECT_EQ(run("auto", &output), 0) << output;
  EXPECT_NE(output.find(CpuIsaSupported(CpuIsa::kAvx512)
                            ? "; OpenBLAS kernels SkylakeX (chosen by recps: OpenBLAS ran "
                              "Haswell)\n"
                            : "; OpenBLAS kernels Haswell\n"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("done: 3 steps"), std::string::npos) << output;
  // Each rate says what it covers (docs/training.md).
  EXPECT_NE(output.find("samples/s timed (this worker: steps 1..3, after 0 warm-up step(s), "
                        "evaluations excluded; the job: "),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("over the whole run (warm-up, evaluations and checkpoints included)"),
            std::string::npos)
      << output;
  EXPECT_EQ(run("env", &output), 0) << output;
  EXPECT_NE(output.find("; OpenBLAS kernels Haswell\n"), std::string::npos) << output;
  EXPECT_EQ(run("fastest", &output), 2) << output;
  EXPECT_NE(output.find("--blas_kernels=fastest: expected auto or env"), std::string::npos)
      << output;
  // Kernels that compute wrong results (here: the check's results
  // corrupted, as a bad OpenBLAS build's would be) are rejected, and the
  // worker trains on the core OpenBLAS had chosen, saying so.
  setenv("RECPS_TEST_CORRUPT_BLAS_CHECK", "1", 1);
  EXPECT_EQ(run("auto", &output), 0) << output;
  unsetenv("RECPS_TEST_CORRUPT_BLAS_CHECK");
  if (CpuIsaSupported(CpuIsa::kAvx512)) {
    EXPECT_NE(output.find("kernels failed recps' check on this CPU"), std::string::npos)
        << output;
    EXPECT_NE(output.find("; OpenBLAS kernels Haswell (recps rejected SkylakeX: GEMM "),
              std::string::npos)
        << output;
  } else {
    EXPECT_NE(output.find("; OpenBLAS kernels Haswell\n"), std::string::npos) << output;
  }
  EXPECT_NE(output.find("done: 3 steps"), std::string::npos) << output;
  if (saved != nullptr) {
    setenv("OPENBLAS_CORETYPE", saved_value.c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
}

// Two workers in each mode: bounded and async reach sync's AUC, and each
// worker's lookups see the staleness its mode allows, no more and (where
// the mode allows any) some. Sync: a lookup of step t waits for step t-1,
// every worker's push of it applied: 0. Bounded and async: the lookup of
// step t+1 runs beside step t, before this worker's own push of step t is
// in, so at least 1 (over 800 steps some lookup is answered before it);
// bounded at most k = 1. Async has no bound of its own, but the allreduce
// keeps the workers within a step of each other: a lookup made during step
// t finds every worker's step t-2 applied, at most 2. A server that ran
// bounded as sync would fail `> 0`; one that ignored the bound, `<= k`
// whenever a lookup runs before the other worker's push of the step
// before (tests/server/shard/lookup_staleness_test.cc pins that case down
// with the pushes in the test's hands).
TEST(WorkerEndToEnd, BoundedAndAsyncReachTheAucOfSync) {
  const std::vector<WorkerRun> sync = TrainTwo("SYNC");
  ASSERT_EQ(sync.size(), 2u);
  ASSERT_FALSE(sync[0].aucs.empty());
  for (int r = 0; r < 2; ++r) EXPECT_EQ(sync[r].max_staleness, 0) << "SYNC rank " << r;
  for (const char* mode : {"BOUNDED", "ASYNC"}) {
    const std::vector<WorkerRun> runs = TrainTwo(mode);
    ASSERT_EQ(runs.size(), 2u) << mode;
    ASSERT_FALSE(runs[0].aucs.empty()) << mode;
    EXPECT_NEAR(runs[0].aucs.back(), sync[0].aucs.back(), 0.01) << mode;
    const int64_t bound = std::string(mode) == "BOUNDED" ? kStaleness : 2;
    for (int r = 0; r < 2; ++r) {
      EXPECT_GT(runs[r].max_staleness, 0) << mode << " rank " << r;
      EXPECT_LE(runs[r].max_staleness, bound) << mode << " rank " << r;
    }
  }
}

TEST(WorkerEndToEnd, SmallExampleLearns) {
  const std::string job = std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto";
  auto shard = testing::LocalShard::Start(
      RECPS_SHARD_BINARY, {"--job=" + job, "--standalone", "--world_size=1"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  testing::TempDir dir;
  const std::string result = dir.path() + "/result.json";
  absl::StatusOr<int> code = testing::RunProcess(
      RECPS_WORKER_BINARY,
      {"--config=" + job, "--shards=" + (*shard)->address(), "--rank=0",
       "--world_size=1", "--steps=800", "--result_json=" + result},
      absl::Minutes(5));
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(*code, 0);
  std::stringstream json;
  json << std::ifstream(result).rdbuf();
  const std::vector<double> aucs = Aucs(json.str());
  ASSERT_GE(aucs.size(), 2u) << json.str();
  EXPECT_GE(aucs.back(), 0.7) << json.str();
  EXPECT_GE(aucs.back(), aucs.front() + 0.1) << json.str();
}

}  // namespace
}  // namespace recps

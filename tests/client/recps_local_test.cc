// `recps local` end to end: it starts a coordinator, shard servers and
// workers, trains to the AUC it prints, and stops everything; it restarts a
// coordinator that dies, names a shard server that dies, and Ctrl-C leaves
// no process behind.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/launcher/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda_util.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::testing::HasSubstr;

std::string Job() { return std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto"; }

// The processes whose parent is `parent`, from /proc/*/stat, with their
// command names (/proc/PID/comm: at most 15 characters).
std::vector<std::pair<pid_t, std::string>> ChildrenOf(pid_t parent) {
  std::vector<std::pair<pid_t, std::string>> children;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
    const std::string stat = ::recps::testing::ReadAll(entry.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    const std::vector<std::string> fields =
        absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
    pid_t ppid = 0;
    if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &ppid) || ppid != parent) continue;
    const size_t open = stat.find('(');
    children.emplace_back(pid, stat.substr(open + 1, close - open - 1));
  }
  return children;
}

// Whether `pid` is gone (or only a zombie waiting for its new parent).
bool Gone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string stat = ::recps::testing::ReadAll(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = stat.rfind(')');
  return close == std::string::npos || stat.substr(close + 2, 1) == "Z";
}

// A `recps local` run in the background, its output in a file.
class LocalRun {
 public:
  explicit LocalRun(std::vector<std::string> args) {
    bool has_job = false;
    for (const std::string& a : args) has_job |= absl::StartsWith(a, "--job=");
    if (!has_job) args.insert(args.begin(), "--job=" + Job());
    args.insert(args.begin(), {"local", "--work_dir=" + dir_.path() + "/work"});
    absl::StatusOr<pid_t> pid = client::SpawnProcess(RECPS_LAUNCHER_BINARY, args, log());
    EXPECT_TRUE(pid.ok()) << pid.status();
    pid_ = pid.ok() ? *pid : -1;
  }
  ~LocalRun() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string log() const { return dir_.path() + "/output.log"; }
  std::string output() const { return ::recps::testing::ReadAll(log()); }

  // The exit code (128 + signal if killed), or -1 past `timeout` (then the
  // run is killed).
  int Wait(absl::Duration timeout) {
    int status = 0;
    if (!testing::Eventually([&] { return waitpid(pid_, &status, WNOHANG) == pid_; },
                             timeout)) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
      return -1;
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // The pid of the launcher's child named `comm` (as /proc shows it), or -1.
  pid_t Child(const std::string& comm) const {
    for (const auto& [pid, name] : ChildrenOf(pid_)) {
      if (name == comm) return pid;
    }
    return -1;
  }

  // The pid of the line starting with `prefix` in the launcher's pid file
  // (WORK/pids: "<description> <pid>" per child), or -1.
  pid_t PidFromPidFile(const std::string& prefix) const {
    for (absl::string_view line : absl::StrSplit(::recps::testing::ReadAll(dir_.path() + "/work/pids"), '\n')) {
      if (!absl::StartsWith(line, prefix)) continue;
      pid_t pid = -1;
      if (absl::SimpleAtoi(line.substr(line.rfind(' ') + 1), &pid)) return pid;
    }
    return -1;
  }

  // A file of the run's work folder.
  std::string WorkFile(const std::string& name) const {
    return ::recps::testing::ReadAll(dir_.path() + "/work/" + name);
  }

  // Waits until rank 0 printed a progress line (training is under way).
  bool Training() const {
    return testing::Eventually(
        [&] { return absl::StrContains(output(), "recps-worker 0] step "); },
        absl::Seconds(120));
  }

 private:
  testing::TempDir dir_;
  pid_t pid_ = -1;
};

// The AUC of "held-out AUC 0.7803" in the launcher's last line, or -1.
double PrintedAuc(const std::string& output) {
  const std::string key = "held-out AUC ";
  const size_t at = output.rfind(key);
  if (at == std::string::npos) return -1;
  return std::atof(output.c_str() + at + key.size());
}

TEST(RecpsLocal, TrainsWithTwoShardsAndTwoWorkers) {
  LocalRun run({"--shards=2", "--workers=2", "--steps=600"});
  EXPECT_EQ(run.Wait(absl::Minutes(4)), 0) << run.output();
  // The small example reaches about 0.78 (0.5 is chance).
  EXPECT_GE(PrintedAuc(run.output()), 0.75) << run.output();
  // On the planner's map, from what the two servers reported (the default).
  EXPECT_THAT(run.WorkFile("coordinator.log"), HasSubstr("planned the shard map (plan 1"));
  // Shard servers on this machine: the overlapped lookup would only compete
  // for the step's cores, so auto turns it off.
  EXPECT_THAT(run.output(), HasSubstr("sync prefetch off (--sync_prefetch=false)"));
}

// Replication 2 over three shard servers trains the same model as one
// copy (sync mode: a backup applies what its primary does, in the same
// order, and the primary's answers wait for it), and asks for enough
// servers (docs/replication.md).
TEST(RecpsLocal, ReplicatedShardsTrainTheSameModel) {
  const auto result = [](const std::string& output) {
    const size_t at = output.rfind("held-out AUC ");
    return at == std::string::npos ? std::string() : output.substr(at, output.find(" after", at) - at);
  };
  std::string one_copy;
  {
    LocalRun run({"--shards=3", "--workers=2", "--steps=60"});
    ASSERT_EQ(run.Wait(absl::Minutes(4)), 0) << run.output();
    one_copy = result(run.output());
  }
  LocalRun run({"--shards=3", "--replication=2", "--workers=2", "--steps=60"});
  ASSERT_EQ(run.Wait(absl::Minutes(4)), 0) << run.output();
  EXPECT_THAT(run.WorkFile("coordinator.log"), HasSubstr("2 copies of each row"));
  ASSERT_FALSE(one_copy.empty());
  EXPECT_EQ(result(run.output()), one_copy) << run.output();

  LocalRun too_many({"--shards=3", "--replication=4", "--steps=1"});
  EXPECT_EQ(too_many.Wait(absl::Minutes(1)), 2);
  EXPECT_THAT(too_many.output(), HasSubstr("--replication=4 needs at least 4 shard servers"));
}

// training.wire_precision reaches the workers' client: rows and gradients
// travel as fp16 / bf16, and the small example still trains to its AUC
// (values round-trip within the precision: tests/client/embedding_client_test).
class RecpsLocalWire : public ::testing::TestWithParam<const char*> {};

TEST_P(RecpsLocalWire, TrainsWithLowerPrecisionOnTheWire) {
  testing::TempDir dir;
  std::string job = ::recps::testing::ReadAll(Job());
  const size_t at = job.find("training {");
  ASSERT_NE(at, std::string::npos);
  job.insert(at + 10, absl::StrCat("\n  wire_precision: ", GetParam()));
  LocalRun run({"--job=" + dir.WriteFile("job.textproto", job), "--shards=1",
                "--workers=1", "--steps=600"});
  EXPECT_EQ(run.Wait(absl::Minutes(4)), 0) << run.output();
  EXPECT_TRUE(absl::StrContains(run.output(),
                                absl::StrCat("travel as ROW_ENCODING_", GetParam())))
      << run.output();
  EXPECT_GE(PrintedAuc(run.output()), 0.75) << run.output();
}

INSTANTIATE_TEST_SUITE_P(Precisions, RecpsLocalWire, ::testing::Values("FLOAT16", "BFLOAT16"));

// Criteo TSV lines (label, 13 integer fields, `categorical` hex fields)
// with a planted signal: a click's log-odds are +-1.5 by C1 (one of 64
// values, the sign by the value's parity) plus 0.8 (log1p(I1) - 2.5), where
// log1p(I1) is uniform on [0, 5). The other fields are noise; C3 is
// multi-hot. The true probabilities' AUC is about 0.87; a model that uses
// only C1 can reach about 0.76, only I1 about 0.71 (the signal needs both).
std::string PlantedCriteoTsv(int categorical, int lines, uint32_t seed) {
  // mt19937's outputs are fixed by the standard (its distributions' are not).
  std::mt19937 rng(seed);
  auto below = [&rng](uint32_t n) { return static_cast<int>(rng() % n); };
  auto unit = [&rng] { return rng() / 4294967296.0; };
  std::string text;
  for (int i = 0; i < lines; ++i) {
    const int key = below(64);
    const int64_t i1 = static_cast<int64_t>(std::expm1(5.0 * unit()));
    const double logit = (key % 2 == 0 ? 1.5 : -1.5) + 0.8 * (std::log1p(i1) - 2.5);
    const bool label = unit() < 1.0 / (1.0 + std::exp(-logit));
    absl::StrAppend(&text, label ? 1 : 0, "\t", i1);
    for (int d = 1; d < 13; ++d) absl::StrAppend(&text, "\t", below(101));
    absl::StrAppend(&text, "\t", absl::Hex(0x68fd1e00 + key));
    for (int f = 1; f < categorical; ++f) {
      absl::StrAppend(&text, "\t", absl::Hex(0x10000 * f + below(1000)));
      if (f == 2) absl::StrAppend(&text, ",", absl::Hex(0x10000 * f + below(1000)));
    }
    absl::StrAppend(&text, "\n");
  }
  return text;
}

// A job of `features` tables and features (one TSV field each) on Criteo
// files.
std::string CriteoJob(int features, const std::string& train, const std::string& eval,
                      int steps) {
  std::string job = "name: \"criteo\"\n";
  for (int f = 0; f < features; ++f) {
    absl::StrAppend(&job, "tables { name: \"t", f,
                    "\" dim: 16 optimizer { kind: ROWWISE_ADAGRAD learning_rate: 0.05 } }\n",
                    "features { name: \"f", f, "\" table: \"t", f, "\" pooling: SUM }\n");
  }
  absl::StrAppend(&job, "model { bottom_mlp: [64, 16] top_mlp: [64, 32, 1] }\n",
                  "training { batch_size: 512 steps: ", steps,
                  " dense_optimizer { kind: ADAM learning_rate: 0.003 }"
                  " consistency { mode: SYNC } eval_interval: 0 eval_batches: 16 seed: 1 }\n",
                  "data { criteo { train_paths: \"", train, "\" eval_paths: \"", eval,
                  "\" } }\n");
  return job;
}

// Criteo-format TSV trains through the real worker path (recps local: a
// coordinator, a shard server, a worker) to the AUC of the signal planted in
// it, with Criteo's 26 categorical fields and with 8 (the worker reads as
// many fields as the job has features; it read 26 whatever the job said).
// recps reaches 0.852 (26 fields) and 0.855 (8) in 40 steps; with labels
// independent of the features it got 0.499 and 0.493, and with eval's C1
// values unseen in training (the model cannot use C1) 0.697 and 0.693.
class RecpsLocalCriteo : public ::testing::TestWithParam<int> {};

TEST_P(RecpsLocalCriteo, TrainsToThePlantedSignal) {
  const int features = GetParam();
  constexpr int kSteps = 40;
  testing::TempDir dir;
  const std::string train =
      dir.WriteFile("train.tsv", PlantedCriteoTsv(features, kSteps * 512, /*seed=*/1));
  const std::string eval =
      dir.WriteFile("eval.tsv", PlantedCriteoTsv(features, 16 * 512, /*seed=*/2));
  const std::string job =
      dir.WriteFile("job.textproto", CriteoJob(features, train, eval, kSteps));
  LocalRun run({"--job=" + job, "--shards=1", "--workers=1"});
  EXPECT_EQ(run.Wait(absl::Minutes(2)), 0) << run.output();
  EXPECT_THAT(run.output(), HasSubstr(absl::StrCat("after step ", kSteps, " ")));
  EXPECT_GE(PrintedAuc(run.output()), 0.80) << run.output();
}

INSTANTIATE_TEST_SUITE_P(Fields, RecpsLocalCriteo, ::testing::Values(26, 8));

TEST(RecpsLocal, BadJobIsRefusedBeforeAnythingStarts) {
  testing::TempDir dir;
  const std::string job = dir.WriteFile("bad.textproto", "tables { name: \"t\" dim: 0 }\n");
  absl::StatusOr<int> code = testing::RunProcess(
      RECPS_LAUNCHER_BINARY, {"local", "--job=" + job}, absl::Minutes(1));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);
}

// A flag of the other command was silently ignored (`recps launch
// --steps=100` ran the job's full length): both commands refuse one, exit
// 2, naming it, before starting anything.
TEST(RecpsLocal, AFlagOfTheOtherCommandIsRefusedNamingIt) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"launch", "--coordinator=127.0.0.1:1", "--steps=100"},
       "recps launch: --steps is a flag of recps local only"},
      {{"launch", "--coordinator=127.0.0.1:1", "--workers=2"},
       "recps launch: --workers is a flag of recps local only"},
      {{"local", "--nproc_per_node=2"},
       "recps local: --nproc_per_node is a flag of recps launch only"},
  };
  for (const Case& c : cases) {
    testing::TempDir dir;
    const std::string log = dir.path() + "/output.log";
    absl::StatusOr<pid_t> pid = client::SpawnProcess(RECPS_LAUNCHER_BINARY, c.args, log);
    ASSERT_TRUE(pid.ok()) << pid.status();
    int status = 0;
    ASSERT_TRUE(testing::Eventually([&] { return waitpid(*pid, &status, WNOHANG) == *pid; },
                                    absl::Seconds(30)));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << c.args[1];
    EXPECT_THAT(::recps::testing::ReadAll(log), HasSubstr(c.message));
  }
}

// `recps local --insecure --shards=1 --steps=5 ARGS` in `dir`, output to
// `log`; its exit code (128 + the signal when killed).
int RunLocalToExit(const testing::TempDir& dir, std::vector<std::string> args,
                   const std::string& log) {
  args.insert(args.begin(), {"local", "--insecure", "--work_dir=" + dir.path() + "/work",
                             "--shards=1", "--steps=5"});
  absl::StatusOr<pid_t> pid = client::SpawnProcess(RECPS_LAUNCHER_BINARY, args, log);
  EXPECT_TRUE(pid.ok()) << pid.status();
  if (!pid.ok()) return -1;
  int status = 0;
  waitpid(*pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// --shard_device reaches every recps-shard: on a machine without a usable
// GPU, cuda:0 stops the run at start with the shard server's reason; a
// value that is no device, and a GPU store with --in_process, are refused
// before anything starts.
TEST(RecpsLocal, ShardDeviceReachesTheShardServers) {
  testing::TempDir dir;
  auto run = [&](std::vector<std::string> args, const std::string& log) {
    args.insert(args.begin(), "--workers=1");
    return RunLocalToExit(dir, std::move(args), log);
  };
  const std::string bad = dir.path() + "/bad.log";
  EXPECT_EQ(run({"--shard_device=gpu"}, bad), 2);
  EXPECT_THAT(::recps::testing::ReadAll(bad), HasSubstr("--shard_device=gpu: expected cpu, cuda or cuda:N"));
  const std::string in_process = dir.path() + "/in_process.log";
  EXPECT_EQ(run({"--shard_device=cuda:0", "--in_process"}, in_process), 2);
  EXPECT_THAT(::recps::testing::ReadAll(in_process), HasSubstr("needs separate shard servers"));
  absl::StatusOr<int> gpus = kernels::CudaDeviceCount();
  if (!gpus.ok() || *gpus > 0) return;  // the GPU store may start here
  const std::string cuda = dir.path() + "/cuda.log";
  EXPECT_NE(run({"--shard_device=cuda:0"}, cuda), 0);
  EXPECT_THAT(::recps::testing::ReadAll(cuda), HasSubstr("recps-shard exited during start-up"));
  EXPECT_THAT(::recps::testing::ReadAll(cuda), HasSubstr("device cuda:0"));
}

// --gpus gives each worker process its own GPU: CUDA_VISIBLE_DEVICES=its GPU
// and --device=cuda:0, one worker per listed GPU. Without a GPU the workers
// stop at start naming the device and the GPU they were given.
TEST(RecpsLocal, GpusGiveEachWorkerItsOwnGpu) {
  testing::TempDir dir;
  auto run = [&](std::vector<std::string> args, const std::string& log) {
    return RunLocalToExit(dir, std::move(args), log);
  };
  const std::string one_process = dir.path() + "/one_process.log";
  EXPECT_EQ(run({"--gpus=0", "--in_process", "--one_process"}, one_process), 2);
  EXPECT_THAT(::recps::testing::ReadAll(one_process), HasSubstr("drop one of them"));
  absl::StatusOr<int> gpus = kernels::CudaDeviceCount();
  if (!gpus.ok() || *gpus > 0) return;  // the workers may train here
  const std::string log = dir.path() + "/gpus.log";
  EXPECT_NE(run({"--gpus=0,1"}, log), 0);
  const std::string text = ::recps::testing::ReadAll(log);
  EXPECT_THAT(text, HasSubstr("2 worker(s) on GPUs 0,1"));
  EXPECT_THAT(text, HasSubstr("worker 0: GPU 0"));
  EXPECT_THAT(text, HasSubstr("worker 1: GPU 1"));
  EXPECT_THAT(text, HasSubstr("device cuda:0"));
  // A CUDA build names the GPU each worker was given; a CPU-only build
  // (CI's clang tree) stops before it looks.
  EXPECT_THAT(text, ::testing::AnyOf(HasSubstr("CUDA_VISIBLE_DEVICES=0)"),
                                     HasSubstr("CUDA_VISIBLE_DEVICES=1)"),
                                     HasSubstr("this build has no CUDA")));
}

// A hand-started cluster rides out a coordinator restart; so does
// `recps local`: it starts the coordinator again on its port with its state.
TEST(RecpsLocal, KilledCoordinatorIsRestartedAndTheJobFinishes) {
  LocalRun run({"--shards=2", "--workers=2", "--steps=1500"});
  ASSERT_TRUE(run.Training()) << run.output();
  const pid_t coordinator = run.Child("recps-coordinat");
  ASSERT_GT(coordinator, 0) << run.output();
  ASSERT_EQ(kill(coordinator, SIGKILL), 0);
  EXPECT_EQ(run.Wait(absl::Minutes(4)), 0) << run.output();
  const std::string output = run.output();
  EXPECT_TRUE(absl::StrContains(output, absl::StrCat("(pid ", coordinator,
                                                     ") was killed by signal 9; restarting "
                                                     "it on the same address")))
      << output;
  EXPECT_TRUE(absl::StrContains(output, "the coordinator was restarted 1 time(s)")) << output;
  EXPECT_GE(PrintedAuc(output), 0.75) << output;
}

// A shard server's rows live in its memory: its death stops the run, and
// the launcher says which one.
TEST(RecpsLocal, KilledShardServerIsNamed) {
  LocalRun run({"--shards=2", "--workers=1", "--steps=100000"});
  ASSERT_TRUE(run.Training()) << run.output();
  const pid_t shard = run.PidFromPidFile("shard server 1 ");
  ASSERT_GT(shard, 0) << run.output();
  ASSERT_EQ(run.Child("recps-shard") > 0, true);
  ASSERT_EQ(kill(shard, SIGKILL), 0);
  EXPECT_EQ(run.Wait(absl::Minutes(1)), 1) << run.output();
  const std::string output = run.output();
  EXPECT_TRUE(absl::StrContains(output, "shard server 1 (127.0.0.1:")) << output;
  EXPECT_TRUE(absl::StrContains(output, absl::StrCat("(pid ", shard,
                                                     ") was killed by signal 9")))
      << output;
}

TEST(RecpsLocal, InterruptStopsTheClusterAndLeavesNoProcess) {
  LocalRun run({"--steps=100000"});
  ASSERT_TRUE(run.Training()) << run.output();
  const std::vector<std::pair<pid_t, std::string>> children = ChildrenOf(run.pid());
  // A coordinator, two shard servers, two workers.
  ASSERT_EQ(children.size(), 5u) << run.output();
  kill(run.pid(), SIGINT);
  EXPECT_EQ(run.Wait(absl::Seconds(60)), 130) << run.output();
  for (const auto& [pid, name] : children) {
    EXPECT_TRUE(testing::Eventually([pid = pid] { return Gone(pid); }, absl::Seconds(5)))
        << name << " (pid " << pid << ") outlived recps local";
  }
}

}  // namespace
}  // namespace recps

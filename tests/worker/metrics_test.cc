// The /metrics text of every daemon (recps-worker, recps-shard,
// recps-coordinator), scraped over HTTP from real processes, passes
// `promtool check metrics` (Prometheus naming: one metric per quantity, its
// unit in the name, _total on counters). Skipped only where promtool is not
// installed (scripts/install-deps.sh --test installs it; CI has it).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/launcher/process.h"
#include "gtest/gtest.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/metrics_scrape.h"

namespace recps {
namespace {

std::string Job() { return std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto"; }

// promtool on $PATH, or "".
std::string FindPromtool() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = dir + "/promtool";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The metrics port from a daemon's port file ("<grpc port> <metrics port>").
int MetricsPort(const std::string& port_file) {
  std::ifstream in(port_file);
  int grpc = 0, metrics = 0;
  return in >> grpc >> metrics ? metrics : 0;
}

// Runs `promtool check metrics` on `text`; returns its exit code and output.
int PromtoolCheck(const std::string& promtool, const std::string& text,
                  std::string* output) {
  testing::TempDir dir;
  const std::string in = dir.WriteFile("metrics.txt", text);
  const std::string command = promtool + " check metrics < " + in + " 2>&1";
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) output->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Metrics, EveryDaemonPassesPromtool) {
  const std::string promtool = FindPromtool();
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool is not installed (Debian package prometheus; "
                    "scripts/install-deps.sh --test)";
  }
  testing::TempDir dir;

  // A coordinator with its own state.
  const std::string coordinator_ports = dir.path() + "/coordinator.ports";
  absl::StatusOr<client::ChildProcess> coordinator = client::ChildProcess::Spawn(
      RECPS_COORDINATOR_BINARY,
      {"--state_dir=" + dir.path() + "/state", "--job=" + Job(), "--num_shards=1",
       "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--insecure",
       "--port_file=" + coordinator_ports},
      dir.path() + "/coordinator.log");
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  // A standalone shard server and a worker training against it for long
  // enough to be scraped mid-run.
  auto shard = testing::LocalShard::Start(
      RECPS_SHARD_BINARY, {"--job=" + Job(), "--standalone", "--world_size=1"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::string worker_ports = dir.path() + "/worker.ports";
  absl::StatusOr<client::ChildProcess> worker = client::ChildProcess::Spawn(
      RECPS_WORKER_BINARY,
      {"--config=" + Job(), "--shards=" + (*shard)->address(), "--steps=1000000",
       "--metrics_listen=127.0.0.1:0", "--port_file=" + worker_ports, "--insecure"},
      dir.path() + "/worker.log");
  ASSERT_TRUE(worker.ok()) << worker.status();

  struct Target {
    std::string name;
    std::function<int()> port;
    std::vector<std::string> expected;  // metric names this daemon exports
  };
  const std::vector<Target> targets = {
      {"recps-worker", [&] { return MetricsPort(worker_ports); },
       {"recps_worker_steps_total", "recps_worker_samples_total",
        "recps_worker_samples_per_second", "recps_worker_loss", "recps_worker_eval_auc",
        "recps_worker_eval_normalized_entropy", "recps_worker_step_seconds_bucket{",
        "phase=\"lookup\"", "phase=\"allreduce\""}},
      {"recps-shard", [&] { return (*shard)->metrics_port(); },
       {"recps_shard_requests_total"}},
      {"recps-coordinator", [&] { return MetricsPort(coordinator_ports); },
       {"recps_coordinator_shard_map_epoch"}},
  };
  for (const Target& t : targets) {
    std::string text;
    // Poll until it serves (the worker: until it trained a step).
    ASSERT_TRUE(testing::Eventually(
        [&] {
          const int port = t.port();
          text = port > 0 ? testing::ScrapeMetrics(port) : "";
          return absl::StrContains(text, t.expected[0]) &&
                 (t.name != "recps-worker" ||
                  !absl::StrContains(text, t.expected[0] + " 0\n"));
        },
        absl::Seconds(60)))
        << t.name << " served no metrics:\n" << text;
    for (const std::string& name : t.expected) {
      EXPECT_TRUE(absl::StrContains(text, name)) << t.name << " lacks " << name;
    }
    std::string lint;
    EXPECT_EQ(PromtoolCheck(promtool, text, &lint), 0)
        << t.name << ": promtool check metrics:\n" << lint << "\n" << text;
    EXPECT_EQ(lint, "") << t.name;
  }
  // The old mixed-unit gauge is gone.
  EXPECT_FALSE(absl::StrContains(testing::ScrapeMetrics(MetricsPort(worker_ports)), "recps_worker{"));
}

}  // namespace
}  // namespace recps

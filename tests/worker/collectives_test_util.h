// Helpers for the collectives tests: temp dirs, ranks as threads or as
// forked processes (each killed if it outlives its timeout).
#ifndef RECPS_TESTS_WORKER_COLLECTIVES_TEST_UTIL_H_
#define RECPS_TESTS_WORKER_COLLECTIVES_TEST_UTIL_H_

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/files.h"

namespace recps::worker::testing {

using ::recps::testing::TempDir;

// A prefix no other test (or earlier run sharing a directory) uses.
inline std::string UniquePrefix(const std::string& name) {
  static std::atomic<int> counter{0};
  return absl::StrCat("test/", name, "/", getpid(), "/", counter++);
}

// Rank r's input: small integers, so every float sum is exact.
inline std::vector<float> RankInput(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float((rank + 1) * int(i % 13 + 1));
  return v;
}

inline absl::Status CheckSum(const std::vector<float>& v, int world_size) {
  const int ranks = world_size * (world_size + 1) / 2;
  for (size_t i = 0; i < v.size(); ++i) {
    const float want = float(ranks * int(i % 13 + 1));
    if (v[i] != want) {
      return absl::InternalError(absl::StrCat("element ", i, " of ", v.size(),
                                              ": got ", v[i], ", want ", want));
    }
  }
  return absl::OkStatus();
}

// Runs fn(rank) on `world_size` threads and returns their statuses.
inline std::vector<absl::Status> RunThreads(
    int world_size, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] { results[r] = fn(r); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Runs fn(rank) in a forked child per rank. Each child reports its status
// in a file and exits; one still running at `timeout` is killed. Returns one
// line per rank: "OK", the error, or how the child ended.
inline std::vector<std::string> RunChildren(
    int world_size, const std::string& dir, absl::Duration timeout,
    const std::function<absl::Status(int)>& fn) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world_size; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(static_cast<unsigned>(absl::ToInt64Seconds(timeout)) + 5);
      const absl::Status status = fn(r);
      std::ofstream(absl::StrCat(dir, "/result.", r)) << status.ToString();
      _exit(status.ok() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<std::string> results(world_size);
  std::vector<bool> done(world_size, false);
  const absl::Time deadline = absl::Now() + timeout;
  for (int remaining = world_size; remaining > 0;) {
    for (int r = 0; r < world_size; ++r) {
      if (done[r]) continue;
      int wstatus = 0;
      const bool late = absl::Now() >= deadline;
      if (late) kill(pids[r], SIGKILL);
      if (waitpid(pids[r], &wstatus, late ? 0 : WNOHANG) != pids[r]) continue;
      done[r] = true;
      --remaining;
      std::ifstream in(absl::StrCat(dir, "/result.", r));
      std::stringstream text;
      text << in.rdbuf();
      results[r] = late ? "killed after timeout"
                   : WIFSIGNALED(wstatus)
                       ? absl::StrCat("killed by signal ", WTERMSIG(wstatus))
                       : text.str();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return results;
}

}  // namespace recps::worker::testing

#endif  // RECPS_TESTS_WORKER_COLLECTIVES_TEST_UTIL_H_

// Starts a real recps-shard process on 127.0.0.1 with an OS-picked port, for
// multi-process tests; stops it (SIGTERM, then SIGKILL) when destroyed.
#ifndef RECPS_TESTS_TESTING_LOCAL_SHARD_H_
#define RECPS_TESTS_TESTING_LOCAL_SHARD_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/files.h"  // TempDir

namespace recps::testing {

// Runs `binary` with `args` to completion; returns its exit code, or
// DEADLINE_EXCEEDED (after killing it) when it runs past `timeout`.
// Polls `done` every 20 ms until it returns true (then true) or `timeout`
// passes (then false). For state that other processes reach in their time.
template <typename F>
bool Eventually(F done, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return done();
}

absl::StatusOr<int> RunProcess(const std::string& binary,
                               std::vector<std::string> args,
                               absl::Duration timeout);

class LocalShard {
 public:
  // Runs `binary` with `args` plus --listen (unless `args` has one),
  // --metrics_listen and --port_file, and waits until it serves (or exits, or `timeout` passes).
  static absl::StatusOr<std::unique_ptr<LocalShard>> Start(
      const std::string& binary, std::vector<std::string> args,
      absl::Duration timeout = absl::Seconds(30));
  ~LocalShard();

  const std::string& address() const { return address_; }  // 127.0.0.1:port
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }

  // Sends SIGTERM and waits for the exit; returns the exit code (or
  // DEADLINE_EXCEEDED when it does not stop within `timeout`).
  absl::StatusOr<int> Terminate(absl::Duration timeout = absl::Seconds(20));
  // SIGKILL without waiting for anything to finish (a crash).
  void Kill();

 private:
  LocalShard() = default;
  TempDir dir_;
  pid_t pid_ = -1;
  std::string address_;
  int metrics_port_ = 0;
};

// A coordinator and shard servers registered with it, as real processes.
struct CoordinatedCluster {
  std::unique_ptr<LocalShard> coordinator;
  std::vector<std::unique_ptr<LocalShard>> shards;
  std::vector<std::string> addresses;  // the shards', in start order
};

// Starts `coordinator_binary` with `coordinator_args`, then `count` shard
// servers (`shard_binary`) with `shard_args` and --coordinator=<its
// address>. The coordinator builds and pushes the map (give it
// --num_shards); this does not wait for it.
// `per_shard(i)`, if set, adds arguments of shard server i (its --zone).
absl::StatusOr<CoordinatedCluster> StartCoordinatedCluster(
    const std::string& coordinator_binary, const std::vector<std::string>& coordinator_args,
    const std::string& shard_binary, const std::vector<std::string>& shard_args, int count,
    const std::function<std::vector<std::string>(int)>& per_shard = nullptr);

// Starts `count` shard servers with `args` (not --standalone: they wait for a
// map) and installs one shard map over all of them (epoch 1, `num_slots`).
absl::StatusOr<std::vector<std::unique_ptr<LocalShard>>> StartShardCluster(
    const std::string& binary, const std::vector<std::string>& args, int count,
    uint32_t num_slots);

// Installs `map` (epoch, num_slots, servers) on every server it lists,
// through ShardAdmin.SetShardMap.
absl::Status InstallShardMap(const std::vector<std::string>& servers,
                             uint64_t epoch, uint32_t num_slots);

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_LOCAL_SHARD_H_

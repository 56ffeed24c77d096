// `recps local`: a coordinator, shard servers and workers as processes on
// 127.0.0.1, trained to the end, restarted from the newest checkpoint when
// a process dies (--max_restarts). client/launcher/recps_main.cc defines
// the flags and fills LocalClusterOptions from them; recps_main.cc's header
// comment describes the command.
#ifndef RECPS_CLIENT_LAUNCHER_LOCAL_CLUSTER_H_
#define RECPS_CLIENT_LAUNCHER_LOCAL_CLUSTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/file_system.h"
#include "common/rpc/tls_flags.h"

namespace recps::client {

// The flags of `recps local`, one field each (same name, same meaning);
// RunLocal checks them and names the flag of a bad value.
struct LocalClusterOptions {
  std::string job;  // "": examples/small.textproto
  int shards = 0;   // 0: 2, or with in_process one per worker
  int replication = 0;  // copies of each row; 0: the job's
  int workers = 2;
  // One per worker, reused round-robin (--gpus); empty: CPU workers.
  std::vector<std::string> gpus;
  bool in_process = false;
  bool one_process = false;
  std::string sync_prefetch = "auto";
  std::string shard_device = "cpu";
  std::string consistency;  // "": the job's
  // recps-coordinator --sharding: planned or even.
  std::string sharding = "planned";
  int staleness = 1;
  int64_t steps = 0;  // 0: the job's
  std::string bin_dir;
  std::string work_dir;  // "": a new /tmp/recps-local-* directory
  std::string result_dir;
  int coordinator_restarts = 3;
  bool resume = false;
  int max_restarts = 0;
  absl::Duration stop_timeout = absl::Seconds(120);
  absl::Duration start_timeout = absl::Seconds(60);
  // --tls_ca/--tls_cert/--tls_key must be empty: `recps local` makes its
  // own certificates (or runs plaintext with --insecure).
  rpc::TlsFlagValues tls;
  // What followed "--": appended to every worker's flags (last wins).
  std::vector<std::string> worker_args;
  // Not a flag: what the launcher itself reads and writes (the work and
  // result directories, the job's copy, port and pid files, clean-up) goes
  // through it, so tests can inject a full disk. Not owned.
  FileSystem* file_system = FileSystem::Default();
};

// Runs the local cluster until the job ends, it fails for good, or a
// SIGINT/SIGTERM (blocked by the caller) stops it. Returns the exit code:
// 0, 1 (a process failed, or a start-up error), 2 (bad options: nothing
// started), 128 + a signal, or kExitFinalCheckpointFailed.
int RunLocal(const LocalClusterOptions& options);

}  // namespace recps::client

#endif  // RECPS_CLIENT_LAUNCHER_LOCAL_CLUSTER_H_

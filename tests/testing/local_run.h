// One `recps local` run of a small deterministic job, and what end-to-end
// tests compare between runs: the final checkpoint's rows (by key, so the
// shard count does not matter), its dense state and every rank's per-step
// losses. Shared by the checkpoint, rebalance and in-process e2e tests.
#ifndef RECPS_TESTS_TESTING_LOCAL_RUN_H_
#define RECPS_TESTS_TESTING_LOCAL_RUN_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/launcher/process.h"
#include "tests/testing/files.h"  // ReadAll, for the tests that use this
#include "tests/testing/local_shard.h"

namespace recps::testing {

// The job: 4 tables of 16 floats (`optimizer`), batch 64, sync mode,
// Adam on the dense part, zipf synthetic data, a checkpoint every
// `checkpoint_every` steps (keep_last 2) into the run's checkpoint folder.
struct SmallJob {
  std::string name = "e2e";
  int steps = 300;
  int checkpoint_every = 20;
  std::string optimizer = "ROWWISE_ADAGRAD";  // the tables' OptimizerKind
};

struct LocalRun {
  explicit LocalRun(SmallJob job = SmallJob());

  // Starts `recps local` with `shards` shard servers and `workers` workers
  // (each worker: one thread, its losses in <dir>/loss<rank>.log), `extra`
  // before the `--` that starts the worker flags; its output goes to `log`.
  absl::StatusOr<client::ChildProcess> Start(int shards, std::vector<std::string> extra) const;
  // Lines of rank 0's loss log so far.
  int LossLines() const;
  // The pid of the child whose line in WORK/pids starts with `name`, or 0.
  pid_t PidOf(const std::string& name) const;
  // 127.0.0.1:port from a port file in the work folder ("" before it exists).
  std::string PortAddress(const std::string& file) const;
  std::string Coordinator() const { return PortAddress("coordinator.ports"); }
  std::string Shard(int i) const;
  // `recps local` runs mutual TLS with certificates in <work>/certs (made
  // before it starts the coordinator): `role`'s flags ({"--insecure"} when
  // the run is plaintext).
  std::vector<std::string> TlsFlags(const std::string& role) const;
  // The process's own gRPC clients call as admin from now on.
  void UseAdminCertificate() const;

  SmallJob spec;
  int workers = 2;
  // Plaintext instead of `recps local`'s default mutual TLS.
  bool insecure = false;
  std::unique_ptr<TempDir> dir = std::make_unique<TempDir>();
  std::string checkpoints = dir->path() + "/ckpt";
  std::string job;
  std::string work = dir->path() + "/work";
  std::string log = dir->path() + "/recps.log";
};

// ROOT/step-NNNNNNNNNNNN, the folder of the checkpoint at `step`.
std::string CheckpointDir(const std::string& root, int64_t step);

// Everything compared between runs.
struct RunOutcome {
  std::map<std::string, std::string> rows;  // row key -> fused row bytes
  std::string dense;                        // the DenseState's fields
  std::vector<std::map<int64_t, std::string>> losses;  // per rank: step -> loss text
  std::string error;  // a replayed step whose loss differed, a row in two files
};

// Reads the final checkpoint (step spec.steps) and the loss logs of `run`.
RunOutcome CollectOutcome(const LocalRun& run);
// The outcome of `run` started with `shards` shard servers and no other
// flags, run to its end (at most `timeout`). ctest runs each case of a
// suite in a process of its own, and each would run the suite's reference
// again: the first writes it to a file in the temp dir, named by the job
// and the size and time of every recps binary, and the others read it
// (waiting for the first, under a file lock).
absl::StatusOr<RunOutcome> ReferenceOutcome(const LocalRun& run, int shards,
                                            absl::Duration timeout);
// EXPECTs (gtest) that `got` equals `reference`, bit for bit, and that the
// reference has every step's loss. With `read_only_rows_of` (the run's job
// file), a row of the reference that `got` lacks passes when it holds its
// table's initial value for its id: a row only read (an evaluation's
// lookup) and never updated, which after a failover exists only on the
// lost primary (docs/replication.md); its next read creates it again, the
// same.
void ExpectSameOutcome(const RunOutcome& reference, const RunOutcome& got, int steps,
                       const std::string& read_only_rows_of = "");

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_LOCAL_RUN_H_

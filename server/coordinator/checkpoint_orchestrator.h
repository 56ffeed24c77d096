// The coordinator's side of checkpoints (docs/operations.md): the cut
// barrier of the workers, the shard servers' snapshots (ShardAdmin.SaveRows,
// in parallel), the dense state file, the manifest written last, pruning to
// keep_last, the listing, and --restore (the chain checked at start, rows
// restored once the first map is on every server, the workers' resume
// state).
//
// One background thread runs the checkpoints one at a time (and the restore
// at start); the cut barrier itself holds no thread: CheckpointCut calls
// wait as callbacks. No lock is held across an RPC or a file write.
//
// Thread-safe.
#ifndef RECPS_SERVER_COORDINATOR_CHECKPOINT_ORCHESTRATOR_H_
#define RECPS_SERVER_COORDINATOR_CHECKPOINT_ORCHESTRATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "recps/v1/checkpoint.pb.h"
#include "recps/v1/coordinator.pb.h"
#include "recps/v1/job.pb.h"
#include "recps/v1/shard_admin.pb.h"
#include "server/checkpoint/chain.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace recps::server {

class Coordinator;
class CoordinatorStore;

// The shard servers' checkpoint RPCs, behind an interface so the
// orchestration is testable without servers. Each call is one attempt with
// `timeout`; errors name the server.
class ShardCheckpointRpc {
 public:
  virtual ~ShardCheckpointRpc() = default;
  virtual absl::StatusOr<v1::SaveRowsResponse> SaveRows(
      const std::string& address, const v1::SaveRowsRequest& request,
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::SaveRowsStatusResponse> SaveRowsStatus(
      const std::string& address, const v1::SaveRowsStatusRequest& request,
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::RestoreRowsResponse> RestoreRows(
      const std::string& address, const v1::RestoreRowsRequest& request,
      absl::Duration timeout) = 0;
  // The epoch of the shard map the server routes by (0: none).
  virtual absl::StatusOr<uint64_t> ShardMapEpoch(const std::string& address,
                                                 absl::Duration timeout) = 0;
  // Ends the calls in flight and refuses new ones (CANCELLED), so that a
  // stopping coordinator need not wait for a long RestoreRows.
  virtual void CancelAll() {}
};

// ShardAdmin over rpc::MakeChannel (kControl channels).
std::unique_ptr<ShardCheckpointRpc> MakeGrpcShardCheckpointRpc();

// What an incremental checkpoint's base must share with it: the servers, in
// order, and who owns which slots and tables (after a slot move a server's
// own snapshot no longer covers its slots, so the next checkpoint is full).
std::vector<std::string> CheckpointLayout(const v1::ShardMap& map);

struct CheckpointOrchestratorOptions {
  // --restore: empty: a fresh run; "latest": the newest complete checkpoint
  // under training.checkpoint.dir; "DIR": the newest under DIR (a
  // checkpoint root); "DIR@STEP": that step under DIR.
  std::string restore;
  // Every worker must arrive at a cut within this of the first one, else
  // the cut fails for all (--checkpoint_cut_timeout). Also bounds how long a
  // complete cut waits for the previous checkpoint's files.
  absl::Duration cut_timeout = absl::Minutes(2);
  // Deadline of one SaveRows call: the server first waits for the steps
  // before the cut to be applied, then takes its snapshot.
  absl::Duration snapshot_timeout = absl::Minutes(2);
  // How long the row files may take to be written (--checkpoint_write_timeout).
  absl::Duration write_timeout = absl::Minutes(30);
  // A server that does not answer SaveRowsStatus for this long fails the
  // checkpoint (it died or restarted mid-write).
  absl::Duration unreachable_timeout = absl::Seconds(30);
  // Deadline of RestoreRows on each server, and of waiting for the first
  // map to be installed on every server before it.
  absl::Duration restore_timeout = absl::Minutes(30);
  // Between two SaveRowsStatus rounds.
  absl::Duration poll_interval = absl::Milliseconds(50);
  // Default: MakeGrpcShardCheckpointRpc().
  std::shared_ptr<ShardCheckpointRpc> rpc;
  // The coordinator's own checkpoint file operations (step directories,
  // the dense state file, manifests, listing, pruning, removing a partial
  // checkpoint) go through it; the shard servers write the row files. Not
  // owned; default: POSIX.
  FileSystem* file_system = FileSystem::Default();
};

class CheckpointOrchestrator {
 public:
  using CutDone =
      absl::AnyInvocable<void(absl::StatusOr<v1::CheckpointCutResponse>) &&>;

  // `coordinator` and `store` must outlive this; `registry` may be null.
  // `world_size`: workers meeting at a cut (0: unknown, cuts are refused).
  CheckpointOrchestrator(Coordinator* coordinator, CoordinatorStore* store,
                         CheckpointOrchestratorOptions options, int world_size,
                         std::function<absl::Time()> clock,
                         prometheus::Registry* registry);
  // Fails waiting cuts (CANCELLED) and stops the background thread; a
  // checkpoint being written is abandoned (no manifest: it does not exist).
  ~CheckpointOrchestrator();

  // Once, after the job is set and before serving. With options.restore:
  // resolves the checkpoint and its chain, checks every manifest, the job
  // digest and the dense state file (errors name the file), and starts the
  // background restore (RestoreRows on every server once the first map is
  // on all of them). Without: refuses (FAILED_PRECONDITION) when
  // training.checkpoint.dir already holds complete checkpoints and this
  // coordinator's state shows no earlier run of the job (a fresh run must
  // not overwrite them). A restarted coordinator (same --state_dir) whose
  // restore was done already does not restore again.
  absl::Status Start();

  // A worker at a cut (CheckpointCutRequest). `done` runs once: after every
  // worker arrived and every server took its snapshot, or after the
  // manifest with wait_complete, or with the error.
  void Cut(const v1::CheckpointCutRequest& request, CutDone done);
  // Bumps the request id the heartbeats carry; stored, so it never goes
  // back across a restart.
  absl::StatusOr<v1::RequestCheckpointResponse> Request(const std::string& reason);
  uint64_t request_id() const { return request_id_.load(); }
  absl::StatusOr<v1::ListCheckpointsResponse> List() const;
  // UNAVAILABLE until the rows are restored (or with the restore's error)
  // and while a rollback waits for ranks or runs; resume=false without
  // --restore and after a rollback to step 0.
  absl::StatusOr<v1::GetResumeStateResponse> ResumeState(int32_t rank) const;

  // A worker registered for `rank` (Coordinator::Register). A rank that
  // registers a second time in this coordinator's life is a restarted
  // worker process: the job restarts. Once every rank has registered again
  // (the dead run's workers are gone then: each rank is one process), the
  // servers are rolled back in place to the newest intact checkpoint (step
  // 0 without one), and the ranks' resume state says where to go on.
  void WorkerRegistered(int32_t rank);

  // Fails a cut whose workers did not all arrive in time, and a complete
  // cut that waited too long for the previous checkpoint.
  void Tick();
  // Fails every waiting cut with `status` (shutdown).
  void CancelWaits(const absl::Status& status);

  // For tests: waits until no checkpoint is queued or being written.
  bool WaitIdle(absl::Duration timeout);

 private:
  // The newest complete checkpoint's time, for the age metric.
  void NoteNewestComplete(const v1::CheckpointManifest& manifest);
  struct Metrics;
  struct Arrival {
    v1::WorkerPosition position;
    bool wait_complete = false;
    std::vector<CutDone> done;  // a retried arrival adds its own
  };
  // A cut: its barrier while open, then the checkpoint to write.
  // The user-provided constructors let std::optional<...>::emplace() see
  // them as default-constructible inside this class (clang evaluates that
  // before it has parsed the member initializers).
  struct Cut_ {
    Cut_() {}
    uint64_t step = 0;
    std::string reason;
    absl::Time opened;
    absl::Time deadline;  // of the barrier, then of waiting to be written
    std::string dense_state;
    std::map<int32_t, Arrival> arrivals;
  };
  struct Progress {
    Progress() {}
    uint64_t step = 0;
    int64_t rows_written = 0;
    int64_t rows_total = 0;
    int32_t files_done = 0;
    int32_t files_total = 0;
    absl::Time started;
  };
  struct Restore {
    std::string root;
    std::vector<std::string> chain;  // checkpoint dirs, full one first
    v1::CheckpointManifest manifest;  // of the last one
    std::string dense_state;          // its dense.pb, checked
  };

  absl::StatusOr<v1::JobConfig> CheckpointJob() const;
  absl::Status CheckNoCheckpoints(const v1::JobConfig& job);
  // The checkpoint --restore names, its chain checked (manifests, job
  // digest, worker count, dense state). Without a step: the newest intact
  // one older than `below` (when set), a damaged one skipped with a warning
  // saying why (its step added to `skipped_steps`).
  absl::StatusOr<Restore> ResolveRestore(const std::string& spec, const v1::JobConfig& job,
                                         std::optional<uint64_t> below = std::nullopt,
                                         std::vector<uint64_t>* skipped_steps = nullptr) const;
  // ResolveRestore's check of one checkpoint (ref.step set). `*damaged`:
  // the error is the checkpoint's (broken chain, damaged or missing file),
  // not the run's (another job, another worker count).
  absl::StatusOr<Restore> CheckRestore(const v1::JobConfig& job,
                                       const checkpoint::CheckpointRef& ref,
                                       bool* damaged) const;
  // Makes `restore` the one to restore and the base of the next checkpoint.
  void AdoptRestore(Restore restore) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();
  // RestoreRows on every server of the map: restore_ (replace: as a
  // rollback, the servers forgetting what they hold first).
  void RunRestore(bool replace = false);
  // The rollback of a restarted job (checkpoint_rollback.cc): the newest
  // intact checkpoint of the job's root (else the --restore one, else step
  // 0) restored onto every server in place.
  void RunRollback();
  // RunRollback without a checkpoint: every server forgets its rows, the
  // next checkpoint is a full one.
  void ForgetAll();
  // ResumeState's answer while a rollback waits or runs.
  absl::Status RollbackUnavailable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One checkpoint being written: what RunCheckpoint's steps share.
  struct Writing;
  // Writes one checkpoint; the cut's callbacks are all answered.
  void RunCheckpoint(Cut_ cut);
  // RunCheckpoint's steps; an error leaves the answers to FailCut.
  absl::Status WriteCheckpoint(Cut_& cut, Writing& w);
  // Creates (or reuses) the step's directory, replacing a damaged
  // checkpoint of the step; true when the step is complete already.
  absl::StatusOr<bool> OpenStepDir(Writing& w);
  // Whether the checkpoint is incremental, and on which base.
  void ChooseBase(Writing& w);
  // After the manifest: the next checkpoint's base, metrics, the log line
  // and pruning to keep_last.
  void Commit(const Writing& w, const Cut_& cut,
              const v1::CheckpointManifest& manifest);
  // Records the failure `s` and answers the cut with it (ABORTED for a
  // server's UNAVAILABLE, so that workers do not resend their arrival).
  void FailCut(Cut_& cut, const Writing& w, const absl::Status& s);
  absl::Status SnapshotAll(const v1::ShardMap& map,
                           const std::string& step_dir, uint64_t step,
                           bool incremental, uint64_t base_step,
                           const std::string& digest, int64_t* rows_total);
  absl::StatusOr<std::vector<v1::CheckpointFile>> AwaitFiles(
      const v1::ShardMap& map, uint64_t step);
  void Fail(uint64_t step, const absl::Status& status);
  // Removes the directory of a failed checkpoint (after the servers still
  // writing into it stopped, 10 s at most), so that its files do not keep a
  // full disk full; not when the coordinator stops. Returns what to add to
  // the error ("; its partial files were removed (DIR)").
  std::string DiscardPartial(const v1::ShardMap& map, uint64_t step,
                             const std::string& step_dir, const absl::Status& why);
  // "; the newest complete checkpoint stays: step N (DIR)", for errors.
  std::string NewestCompleteNote(const std::string& root) const;
  // Answers the cut's callbacks: the ones with wait_complete only when
  // `complete` (or on error).
  static void Answer(Cut_& cut, const absl::StatusOr<v1::CheckpointCutResponse>& r,
                     bool complete);
  absl::Time Now() const { return clock_(); }

  Coordinator* const coordinator_;
  CoordinatorStore* const store_;
  const CheckpointOrchestratorOptions options_;
  const int world_size_;
  const std::function<absl::Time()> clock_;
  std::shared_ptr<ShardCheckpointRpc> rpc_;
  std::unique_ptr<Metrics> metrics_;
  std::atomic<uint64_t> request_id_{0};

  mutable absl::Mutex mu_;
  std::optional<Cut_> open_ ABSL_GUARDED_BY(mu_);     // barrier in progress
  std::optional<Cut_> queued_ ABSL_GUARDED_BY(mu_);   // complete, to write
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool restore_queued_ ABSL_GUARDED_BY(mu_) = false;
  // A restarted job (WorkerRegistered): kGathering until every rank is
  // back, kQueued for the loop, kRunning while the servers roll back.
  enum class Rollback { kNone, kGathering, kQueued, kRunning };
  Rollback rollback_ ABSL_GUARDED_BY(mu_) = Rollback::kNone;
  // The ranks registered since the job (re)started.
  std::set<int32_t> ranks_registered_ ABSL_GUARDED_BY(mu_);
  int restarts_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Progress> progress_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::string request_reason_ ABSL_GUARDED_BY(mu_);
  // The base of the next incremental checkpoint: the last complete one of
  // this process (or the restored one), its chain's full step, the
  // CheckpointLayout of the map that took or restored it, and the
  // increments since the full one.
  // base_servers_ empty: the next checkpoint is full.
  uint64_t base_step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t full_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> base_servers_ ABSL_GUARDED_BY(mu_);
  int increments_ ABSL_GUARDED_BY(mu_) = 0;
  // The newest complete checkpoint of this process (or the restored one):
  // a late repeated arrival for it is answered at once.
  uint64_t last_complete_step_ ABSL_GUARDED_BY(mu_) = 0;
  // --restore.
  std::optional<Restore> restore_ ABSL_GUARDED_BY(mu_);
  // What names it: --restore, or "latest" after a rollback.
  std::string restore_spec_ ABSL_GUARDED_BY(mu_);
  bool restored_ ABSL_GUARDED_BY(mu_) = false;
  // Complete checkpoints newer than the restored one that the restore
  // skipped as damaged: the resumed run writes them anew when it gets there
  // (not "complete already").
  std::set<uint64_t> damaged_steps_ ABSL_GUARDED_BY(mu_);
  absl::Status restore_failure_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_CHECKPOINT_ORCHESTRATOR_H_

// A restarted job rolled back in place: `recps launch --max_restarts`, or a
// Kubernetes Job that recreates a worker pod, starts new worker processes
// while the shard servers (on other nodes, in other pods) keep the rows of
// steps past the newest checkpoint. The coordinator notices a rank that
// registers a second time, waits until every rank is back, and has every
// server forget what it holds and restore the newest intact checkpoint
// (RestoreRowsRequest.replace); the ranks then resume from it as after
// --restore. Without a checkpoint the servers forget everything and the job
// starts again at step 0.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/thread_pool.h"
#include "server/checkpoint/chain.h"
#include "server/coordinator/checkpoint_orchestrator.h"
#include "server/coordinator/coordinator.h"

namespace recps::server {

namespace ckpt = checkpoint;

void CheckpointOrchestrator::WorkerRegistered(int32_t rank) {
  std::optional<Cut_> abandoned;
  {
    absl::MutexLock lock(&mu_);
    if (world_size_ <= 0) return;
    if (ranks_registered_.insert(rank).second) {
      if (rollback_ == Rollback::kGathering &&
          ranks_registered_.size() >= static_cast<size_t>(world_size_)) {
        LogInfo("every worker rank is back: rolling the shard servers back");
        rollback_ = Rollback::kQueued;
      }
      return;
    }
    // The rank's earlier process is gone: a new one cannot share its rank.
    ++restarts_;
    ranks_registered_ = {rank};
    rollback_ = world_size_ == 1 ? Rollback::kQueued : Rollback::kGathering;
    LogWarning("worker rank ", rank, " registered again: the job restarts (restart ",
               restarts_, "); once all ", world_size_,
               " ranks are back, every shard server rolls back to the newest checkpoint");
    // A cut the earlier run had opened never completes.
    abandoned = std::move(open_);
    open_.reset();
  }
  if (abandoned.has_value()) {
    Answer(*abandoned,
           absl::AbortedError(absl::StrCat("the job restarted (worker rank ", rank,
                                           " registered again) before this cut completed")),
           /*complete=*/true);
  }
}

absl::Status CheckpointOrchestrator::RollbackUnavailable() const {
  if (rollback_ == Rollback::kGathering) {
    std::vector<int32_t> missing;
    for (int32_t r = 0; r < world_size_; ++r) {
      if (ranks_registered_.count(r) == 0) missing.push_back(r);
    }
    return absl::UnavailableError(absl::StrCat(
        "the job is restarting: waiting for worker rank(s) ", absl::StrJoin(missing, ", "),
        " to register again before the shard servers roll back"));
  }
  return absl::UnavailableError(
      "the job is restarting: the shard servers are rolling back to the newest checkpoint");
}

void CheckpointOrchestrator::RunRollback() {
  absl::StatusOr<v1::JobConfig> job = coordinator_->GetJob();
  std::optional<Restore> target;
  std::string spec = "latest";
  std::vector<uint64_t> skipped;
  absl::Status failure;
  const std::string root = job.ok() ? job->training().checkpoint().dir() : "";
  if (!root.empty()) {
    absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list =
        ckpt::ListCheckpoints(root, options_.file_system);
    if (list.ok() && !list->empty()) {
      absl::StatusOr<Restore> latest = ResolveRestore(spec, *job, std::nullopt, &skipped);
      if (latest.ok()) {
        target = *std::move(latest);
      } else {
        failure = latest.status();
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (!target.has_value() && failure.ok() && restore_.has_value()) {
      // Nothing newer in the job's root: the checkpoint --restore named.
      target = restore_;
      spec = restore_spec_;
    }
    if (target.has_value()) {
      damaged_steps_.insert(skipped.begin(), skipped.end());
      restore_spec_ = spec;
      AdoptRestore(*target);
      restored_ = false;
      restore_failure_ = absl::OkStatus();
    }
  }
  if (!failure.ok()) {
    LogError("rollback: ", failure.message());
    absl::MutexLock lock(&mu_);
    restore_failure_ = failure;
  } else if (target.has_value()) {
    LogWarning("rollback: every shard server goes back to step ", target->manifest.step(),
               " (", target->chain.back(), ")");
    RunRestore(/*replace=*/true);
  } else {
    ForgetAll();
  }
  absl::MutexLock lock(&mu_);
  if (rollback_ == Rollback::kRunning) rollback_ = Rollback::kNone;
}

void CheckpointOrchestrator::ForgetAll() {
  LogWarning("rollback: no checkpoint to go back to; every shard server forgets its rows "
             "and the job starts again at step 0");
  absl::StatusOr<v1::ShardMap> map = coordinator_->GetShardMap();
  std::vector<std::string> errors;
  if (!map.ok()) {
    errors.push_back(std::string(map.status().message()));
  } else {
    v1::RestoreRowsRequest request;
    request.set_replace(true);
    request.set_step(0);
    const int n = map->servers_size();
    std::vector<absl::StatusOr<v1::RestoreRowsResponse>> results(
        n, absl::UnknownError("not called"));
    RunEachOnItsOwnThread(n, [&](int i) {
      results[i] = rpc_->RestoreRows(map->servers(i), request, options_.restore_timeout);
    });
    for (int i = 0; i < n; ++i) {
      if (!results[i].ok()) {
        errors.push_back(absl::StrCat("shard server ", map->servers(i), ": ",
                                      results[i].status().message()));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  restore_.reset();
  restored_ = false;
  base_servers_.clear();
  base_step_ = full_step_ = last_complete_step_ = 0;
  increments_ = 0;
  if (!errors.empty()) {
    restore_failure_ = absl::UnavailableError(
        absl::StrCat("rolling back to step 0: ", absl::StrJoin(errors, "; ")));
    LogError(restore_failure_.message());
  }
}

}  // namespace recps::server

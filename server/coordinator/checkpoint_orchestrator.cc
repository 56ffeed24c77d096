// Cuts, writing a checkpoint. Restore and the listing: checkpoint_restore.cc.
#include "server/coordinator/checkpoint_orchestrator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/checkpoint/manifest.h"
#include "server/coordinator/checkpoint_contents.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_store.h"

namespace recps::server {

std::vector<std::string> CheckpointLayout(const v1::ShardMap& map) {
  std::vector<std::string> out(map.servers().begin(), map.servers().end());
  v1::ShardMap owners;
  *owners.mutable_slot_owner() = map.slot_owner();
  *owners.mutable_tables() = map.tables();
  out.push_back(absl::StrCat("owners:", owners.SerializeAsString()));
  return out;
}

namespace {

// Per server of `map`: whether it owns any slot, table or column group. A
// server that owns nothing (drained, or listed for a move that failed) has
// no rows to save and may be stopped: it is not asked.
std::vector<bool> OwnsRows(const v1::ShardMap& map) {
  std::vector<bool> owns(map.servers_size(), false);
  auto mark = [&](uint32_t i) {
    if (i < owns.size()) owns[i] = true;
  };
  for (uint32_t o : map.slot_owner()) mark(o);
  for (const v1::TableRouting& t : map.tables()) {
    if (t.column_groups_size() > 0) {
      for (const v1::ColumnGroupRouting& g : t.column_groups()) mark(g.owner());
    } else if (t.slot_owner_size() > 0) {
      for (uint32_t o : t.slot_owner()) mark(o);
    } else {
      mark(t.owner());
    }
  }
  return owns;
}
namespace ckpt = checkpoint;

constexpr char kRequestIdKey[] = "checkpoint/request_id";
std::string RankList(const std::vector<int32_t>& ranks) {
  if (ranks.size() <= 16) return absl::StrJoin(ranks, ", ");
  return absl::StrCat(absl::StrJoin(ranks.begin(), ranks.begin() + 16, ", "), ", ... (",
                      ranks.size(), " in all)");
}

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.001, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800};
}

}  // namespace

struct CheckpointOrchestrator::Metrics {
  explicit Metrics(prometheus::Registry& registry)
      : outcomes(prometheus::BuildCounter()
                     .Name("recps_coordinator_checkpoints_total")
                     .Help("Checkpoints by outcome (written: manifest written; "
                           "failed)")
                     .Register(registry)),
        written(outcomes.Add({{"outcome", "written"}})),
        failed(outcomes.Add({{"outcome", "failed"}})),
        last_step(prometheus::BuildGauge()
                      .Name("recps_coordinator_checkpoint_last_step")
                      .Help("Step of the newest complete checkpoint of this "
                            "coordinator process (or the restored one)")
                      .Register(registry)
                      .Add({})),
        write_seconds(prometheus::BuildHistogram()
                          .Name("recps_coordinator_checkpoint_write_seconds")
                          .Help("From the complete cut to the manifest written")
                          .Register(registry)
                          .Add({}, SecondsBuckets())),
        snapshot_seconds(prometheus::BuildHistogram()
                             .Name("recps_coordinator_checkpoint_snapshot_seconds")
                             .Help("From the complete cut to the workers "
                                   "released (every server took its snapshot): "
                                   "the training stall")
                             .Register(registry)
                             .Add({}, SecondsBuckets())),
        cut_wait_seconds(prometheus::BuildHistogram()
                             .Name("recps_coordinator_checkpoint_cut_wait_seconds")
                             .Help("From the first worker's arrival at a cut "
                                   "to the last one's")
                             .Register(registry)
                             .Add({}, SecondsBuckets())),
        last_success_family(
            prometheus::BuildGauge()
                .Name("recps_checkpoint_last_success_timestamp_seconds")
                .Help("Unix time the newest complete checkpoint was written "
                      "(its manifest's time; absent until there is one)")
                .Register(registry)) {}

  // Sets the newest complete checkpoint's time. The series is added only
  // then: a job without checkpoints exports none, so the age alert
  // (time() - this > 1h) cannot fire on a zero.
  void SetLastSuccess(double unix_seconds) {
    absl::MutexLock lock(&mu);
    if (last_success == nullptr) last_success = &last_success_family.Add({});
    last_success->Set(unix_seconds);
  }
  prometheus::Family<prometheus::Counter>& outcomes;
  prometheus::Counter& written;
  prometheus::Counter& failed;
  prometheus::Gauge& last_step;
  prometheus::Histogram& write_seconds;
  prometheus::Histogram& snapshot_seconds;
  prometheus::Histogram& cut_wait_seconds;
  prometheus::Family<prometheus::Gauge>& last_success_family;
  absl::Mutex mu;
  prometheus::Gauge* last_success ABSL_GUARDED_BY(mu) = nullptr;
};

CheckpointOrchestrator::CheckpointOrchestrator(Coordinator* coordinator,
                                               CoordinatorStore* store,
                                               CheckpointOrchestratorOptions options,
                                               int world_size,
                                               std::function<absl::Time()> clock,
                                               prometheus::Registry* registry)
    : coordinator_(coordinator),
      store_(store),
      options_(std::move(options)),
      world_size_(world_size),
      clock_(clock ? std::move(clock) : [] { return absl::Now(); }),
      rpc_(options_.rpc) {
  if (rpc_ == nullptr) rpc_ = MakeGrpcShardCheckpointRpc();
  if (registry != nullptr) metrics_ = std::make_unique<Metrics>(*registry);
  absl::StatusOr<std::string> id = store_->Get(kRequestIdKey);
  uint64_t value = 0;
  if (id.ok() && id->size() == sizeof(value)) {
    std::memcpy(&value, id->data(), sizeof(value));
    request_id_ = value;
  }
  thread_ = std::thread([this] { Loop(); });
}

CheckpointOrchestrator::~CheckpointOrchestrator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  rpc_->CancelAll();
  thread_.join();
  CancelWaits(absl::CancelledError("the coordinator is stopping"));
}

absl::StatusOr<v1::JobConfig> CheckpointOrchestrator::CheckpointJob() const {
  ASSIGN_OR_RETURN(v1::JobConfig job, coordinator_->GetJob());
  if (job.training().checkpoint().dir().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoints are off: job '", job.name(),
        "' has no training.checkpoint.dir"));
  }
  return job;
}

absl::StatusOr<v1::RequestCheckpointResponse> CheckpointOrchestrator::Request(
    const std::string& reason) {
  RETURN_IF_ERROR(CheckpointJob().status());
  absl::MutexLock lock(&mu_);
  const uint64_t id = request_id_.load() + 1;
  std::string bytes(sizeof(id), '\0');
  std::memcpy(bytes.data(), &id, sizeof(id));
  RETURN_IF_ERROR(store_->Put(kRequestIdKey, bytes));
  request_id_ = id;
  request_reason_ = reason.empty() ? "requested" : reason.substr(0, 256);
  LogInfo("checkpoint requested (", request_reason_, "): request id ", id);
  v1::RequestCheckpointResponse response;
  response.set_request_id(id);
  return response;
}

void CheckpointOrchestrator::Cut(const v1::CheckpointCutRequest& request,
                                 CutDone done) {
  absl::StatusOr<v1::JobConfig> job = CheckpointJob();
  if (!job.ok()) {
    std::move(done)(job.status());
    return;
  }
  if (world_size_ <= 0) {
    std::move(done)(absl::FailedPreconditionError(
        "checkpoint cut: the coordinator does not know the job's world size; "
        "start it with --world_size=N"));
    return;
  }
  const int32_t rank = request.rank();
  if (rank < 0 || rank >= world_size_) {
    std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("checkpoint cut: rank ", rank, " is outside [0, ", world_size_,
                     ") (--world_size)")));
    return;
  }
  std::vector<CutDone> refused;
  absl::Status refusal;
  std::optional<v1::CheckpointCutResponse> complete;
  {
    absl::MutexLock lock(&mu_);
    if (!open_.has_value() && last_complete_step_ != 0 &&
        request.step() == last_complete_step_) {
      // A repeated arrival (a client retry) after the checkpoint completed.
      complete.emplace();
      complete->set_step(request.step());
      complete->set_dir(JoinPath(job->training().checkpoint().dir(),
                                 ckpt::CheckpointDirName(request.step())));
      complete->set_complete(true);
    } else if (restore_.has_value() && !restored_) {
      refusal = absl::UnavailableError(absl::StrCat(
          "checkpoint cut: the shard servers are still restoring step ",
          restore_->manifest.step(),
          restore_failure_.ok() ? "" : absl::StrCat(" (", restore_failure_.message(), ")")));
    } else if (open_.has_value() && open_->step != request.step()) {
      std::vector<int32_t> arrived;
      for (const auto& [r, a] : open_->arrivals) arrived.push_back(r);
      refusal = absl::FailedPreconditionError(absl::StrCat(
          "checkpoint cut: rank ", rank, " arrived for step ", request.step(),
          " while the cut at step ", open_->step, " is open (ranks ", RankList(arrived),
          " arrived); every worker must cut at the same step"));
    } else if (queued_.has_value() && queued_->step == request.step() &&
               queued_->arrivals.count(rank) != 0) {
      // A retry while the complete cut waits for the previous checkpoint.
      queued_->arrivals[rank].done.push_back(std::move(done));
      return;
    } else {
      if (!open_.has_value()) {
        open_.emplace();
        open_->step = request.step();
        open_->reason = request.reason().empty() ? "periodic" : request.reason().substr(0, 256);
        open_->opened = Now();
        open_->deadline = open_->opened + options_.cut_timeout;
      }
      Arrival& arrival = open_->arrivals[rank];
      arrival.position = request.position();
      arrival.position.set_rank(rank);
      arrival.wait_complete = arrival.wait_complete || request.wait_complete();
      arrival.done.push_back(std::move(done));
      if (rank == 0) open_->dense_state = request.dense_state();
      if (static_cast<int>(open_->arrivals.size()) == world_size_) {
        if (queued_.has_value()) {
          // Cannot happen with well-behaved workers: the queued cut's
          // workers wait in it.
          refusal = absl::FailedPreconditionError(absl::StrCat(
              "checkpoint cut at step ", open_->step, ": the cut at step ",
              queued_->step, " still waits to be written"));
          for (auto& [r, a] : open_->arrivals) {
            for (CutDone& d : a.done) refused.push_back(std::move(d));
          }
          open_.reset();
        } else {
          if (metrics_ != nullptr) {
            metrics_->cut_wait_seconds.Observe(
                absl::ToDoubleSeconds(Now() - open_->opened));
          }
          queued_ = std::move(open_);
          open_.reset();
          queued_->deadline = Now() + options_.cut_timeout;
        }
      }
      if (refused.empty()) return;
    }
  }
  if (complete.has_value()) {
    std::move(done)(*std::move(complete));
    return;
  }
  if (refused.empty()) {
    std::move(done)(refusal);
    return;
  }
  for (CutDone& d : refused) std::move(d)(refusal);
}

void CheckpointOrchestrator::Tick() {
  std::vector<CutDone> expired;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    if (open_.has_value() && now > open_->deadline) {
      std::vector<int32_t> missing;
      for (int32_t r = 0; r < world_size_; ++r) {
        if (open_->arrivals.count(r) == 0) missing.push_back(r);
      }
      status = absl::DeadlineExceededError(absl::StrCat(
          "checkpoint cut at step ", open_->step, ": ranks ", RankList(missing),
          " did not arrive within ", absl::FormatDuration(options_.cut_timeout),
          " (--checkpoint_cut_timeout); no checkpoint was taken"));
      for (auto& [r, a] : open_->arrivals) {
        for (CutDone& d : a.done) expired.push_back(std::move(d));
      }
      last_error_ = std::string(status.message());
      open_.reset();
    } else if (queued_.has_value() && writing_ && now > queued_->deadline) {
      status = absl::AbortedError(absl::StrCat(
          "checkpoint cut at step ", queued_->step, ": the checkpoint at step ",
          progress_.has_value() ? progress_->step : 0, " is still being written after ",
          absl::FormatDuration(options_.cut_timeout),
          " (--checkpoint_cut_timeout); no checkpoint was taken at step ",
          queued_->step));
      for (auto& [r, a] : queued_->arrivals) {
        for (CutDone& d : a.done) expired.push_back(std::move(d));
      }
      last_error_ = std::string(status.message());
      queued_.reset();
    }
  }
  if (expired.empty()) return;
  LogError(status.message());
  if (metrics_ != nullptr) metrics_->failed.Increment();
  for (CutDone& d : expired) std::move(d)(status);
}

void CheckpointOrchestrator::CancelWaits(const absl::Status& status) {
  std::vector<CutDone> cancelled;
  {
    absl::MutexLock lock(&mu_);
    for (std::optional<Cut_>* cut : {&open_, &queued_}) {
      if (!cut->has_value()) continue;
      for (auto& [r, a] : (*cut)->arrivals) {
        for (CutDone& d : a.done) cancelled.push_back(std::move(d));
      }
      cut->reset();
    }
  }
  for (CutDone& d : cancelled) std::move(d)(status);
}

bool CheckpointOrchestrator::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      absl::Condition(
          +[](CheckpointOrchestrator* o) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !o->writing_ && !o->queued_.has_value() && !o->restore_queued_ &&
                   o->rollback_ != Rollback::kQueued;
          },
          this),
      timeout);
}

void CheckpointOrchestrator::Loop() {
  while (true) {
    std::optional<Cut_> cut;
    bool rollback = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointOrchestrator* o) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return o->stop_ || o->restore_queued_ || o->queued_.has_value() ||
                   o->rollback_ == Rollback::kQueued;
          },
          this));
      if (stop_) return;
      writing_ = true;
      // A complete cut of the run that failed is written first: it may be
      // the newest checkpoint the rollback goes back to.
      if (restore_queued_) {
        restore_queued_ = false;
      } else if (rollback_ == Rollback::kQueued && !queued_.has_value()) {
        rollback_ = Rollback::kRunning;
        rollback = true;
      } else {
        cut = std::move(queued_);
        queued_.reset();
        progress_.emplace();
        progress_->step = cut->step;
        progress_->started = absl::Now();
      }
    }
    if (cut.has_value()) {
      RunCheckpoint(*std::move(cut));
    } else if (rollback) {
      RunRollback();
    } else {
      RunRestore();
    }
    absl::MutexLock lock(&mu_);
    writing_ = false;
    progress_.reset();
  }
}

void CheckpointOrchestrator::Answer(
    Cut_& cut, const absl::StatusOr<v1::CheckpointCutResponse>& r, bool complete) {
  for (auto& [rank, arrival] : cut.arrivals) {
    if (r.ok() && arrival.wait_complete && !complete) continue;
    for (CutDone& d : arrival.done) std::move(d)(r);
    arrival.done.clear();
  }
}

void CheckpointOrchestrator::Fail(uint64_t step, const absl::Status& status) {
  const std::string message =
      absl::StrCat("checkpoint at step ", step, " failed: ", status.message());
  LogError(message);
  if (metrics_ != nullptr) metrics_->failed.Increment();
  absl::MutexLock lock(&mu_);
  last_error_ = message;
  // The servers' snapshots no longer match one base: start a new chain.
  base_servers_.clear();
}

std::string CheckpointOrchestrator::DiscardPartial(const v1::ShardMap& map, uint64_t step,
                                                   const std::string& step_dir,
                                                   const absl::Status& why) {
  // A stopping coordinator leaves the directory: restarted on the same
  // state, it finishes this step there (the servers go on writing).
  if (absl::IsCancelled(why)) return "";
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return "";
  }
  // Give servers still writing their file a moment to finish or fail (on a
  // full disk they fail soon): a file removed while open keeps its space
  // until it is closed.
  const std::vector<bool> owns = OwnsRows(map);
  const absl::Time deadline =
      absl::Now() + std::min(options_.unreachable_timeout, absl::Seconds(10));
  v1::SaveRowsStatusRequest request;
  request.set_step(step);
  for (int i = 0; i < map.servers_size(); ++i) {
    while (owns[i] && absl::Now() < deadline) {
      absl::StatusOr<v1::SaveRowsStatusResponse> status =
          rpc_->SaveRowsStatus(map.servers(i), request, absl::Seconds(2));
      if (!status.ok() || status->state() != v1::SaveRowsStatusResponse::WRITING) break;
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll_interval)) return "";
    }
  }
  // The manifest is written last and only by this thread: one that exists
  // made the checkpoint complete (a later fsync failed); it stays.
  if (ckpt::ReadManifest(step_dir, options_.file_system).ok()) return "";
  if (absl::Status s = options_.file_system->RemoveTree(step_dir); !s.ok()) {
    LogWarning("removing the partial checkpoint ", step_dir, ": ", s.message());
    return absl::StrCat("; its partial directory ", step_dir,
                        " could not be removed: ", s.message());
  }
  return absl::StrCat("; its partial files were removed (", step_dir, ")");
}

std::string CheckpointOrchestrator::NewestCompleteNote(const std::string& root) const {
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list =
      ckpt::ListCheckpoints(root, options_.file_system);
  if (!list.ok() || list->empty()) {
    return absl::StrCat("; there is no complete checkpoint in ", root);
  }
  return absl::StrCat("; the newest complete checkpoint stays: step ", list->back().step,
                      " (", list->back().dir, ")");
}

struct CheckpointOrchestrator::Writing {
  uint64_t step = 0;
  absl::Time started;
  std::string root;      // training.checkpoint.dir, once the map is read
  // Set once the step's directory is created (or reused): a failure after
  // that removes what was written into it (DiscardPartial).
  std::string step_dir;
  v1::JobConfig job;
  // No slot changes owner between reading the map and every snapshot.
  std::optional<Coordinator::MapChangeGuard> no_hand_over;
  v1::ShardMap map;
  std::vector<std::string> servers;  // CheckpointLayout(map)
  bool incremental = false;
  uint64_t base_step = 0;
  uint64_t full_step = 0;
  int increments = 0;
  std::string digest;
  v1::CheckpointCutResponse response;
};

void CheckpointOrchestrator::RunCheckpoint(Cut_ cut) {
  Writing w;
  w.started = absl::Now();
  w.step = cut.step;
  if (absl::Status s = WriteCheckpoint(cut, w); !s.ok()) FailCut(cut, w, s);
}

void CheckpointOrchestrator::FailCut(Cut_& cut, const Writing& w, const absl::Status& s) {
  std::string message(s.message());
  if (!w.step_dir.empty()) {
    absl::StrAppend(&message, DiscardPartial(w.map, w.step, w.step_dir, s),
                    NewestCompleteNote(w.root));
  }
  if (absl::IsResourceExhausted(s) && !w.root.empty()) {
    absl::StrAppend(&message, "; free space in ", w.root,
                    " or point training.checkpoint.dir at a larger volume");
  }
  const absl::Status failure(s.code(), message);
  Fail(w.step, failure);
  // A server's UNAVAILABLE must not reach the workers as such: their
  // client would resend the arrival. ABORTED: try at a later step.
  const absl::StatusCode code =
      absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s)
          ? absl::StatusCode::kAborted
          : s.code();
  Answer(cut, absl::Status(code, absl::StrCat("checkpoint at step ", w.step,
                                              " failed: ", message)),
         true);
}

absl::Status CheckpointOrchestrator::WriteCheckpoint(Cut_& cut, Writing& w) {
  ASSIGN_OR_RETURN(w.job, CheckpointJob());
  w.no_hand_over.emplace(coordinator_, Coordinator::MapChangeGuard::kSnapshot);
  ASSIGN_OR_RETURN(w.map, coordinator_->GetShardMap());
  ASSIGN_OR_RETURN(const bool complete, OpenStepDir(w));
  if (complete) {
    // A retry after a coordinator restart, or the step that was restored.
    w.response.set_complete(true);
    Answer(cut, w.response, true);
    return absl::OkStatus();
  }
  ChooseBase(w);
  int64_t rows_total = 0;
  RETURN_IF_ERROR(SnapshotAll(w.map, w.step_dir, w.step, w.incremental, w.base_step,
                              w.digest, &rows_total));
  w.no_hand_over.reset();
  ASSIGN_OR_RETURN(const std::optional<v1::CheckpointFile> dense,
                   WriteDenseState(w.step_dir, cut.dense_state, options_.file_system));
  cut.dense_state.clear();
  if (metrics_ != nullptr) {
    metrics_->snapshot_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - w.started));
  }
  Answer(cut, w.response, false);  // training goes on while the files are written

  ASSIGN_OR_RETURN(std::vector<v1::CheckpointFile> files, AwaitFiles(w.map, w.step));
  ManifestParts parts;
  parts.step = w.step;
  parts.job_config_digest = w.digest;
  parts.map = w.map;
  parts.incremental = w.incremental;
  parts.base_step = w.base_step;
  parts.full_step = w.full_step;
  parts.reason = cut.reason;
  parts.created = absl::Now();
  std::vector<v1::WorkerPosition> workers;
  for (auto& [rank, arrival] : cut.arrivals) workers.push_back(arrival.position);
  ASSIGN_OR_RETURN(const v1::CheckpointManifest manifest,
                   MakeManifest(parts, w.job, std::move(files), dense, workers));
  RETURN_IF_ERROR(ckpt::WriteManifest(w.step_dir, manifest, options_.file_system));
  Commit(w, cut, manifest);
  w.response.set_complete(true);
  Answer(cut, w.response, true);
  return absl::OkStatus();
}

absl::StatusOr<bool> CheckpointOrchestrator::OpenStepDir(Writing& w) {
  w.root = w.job.training().checkpoint().dir();
  const std::string dir = JoinPath(w.root, ckpt::CheckpointDirName(w.step));
  w.response.set_step(w.step);
  w.response.set_dir(dir);
  bool damaged = false;
  {
    absl::MutexLock lock(&mu_);
    damaged = damaged_steps_.erase(w.step) > 0;
  }
  if (damaged) {
    // The restore skipped it as damaged: this run replaces it.
    const absl::Status removed = options_.file_system->RemoveTree(dir);
    LogWarning("replacing the damaged checkpoint at step ", w.step, " (", dir, ")",
               removed.ok() ? "" : absl::StrCat(": cannot remove it: ", removed.message()));
  }
  if (ckpt::ReadManifest(dir, options_.file_system).ok()) return true;
  // A partial directory of this step stays: after a coordinator restart
  // the servers may be writing into it.
  if (absl::Status s = options_.file_system->CreateDirs(dir); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot create checkpoint directory ",
                                               dir, ": ", s.message()));
  }
  w.step_dir = dir;
  return false;
}

void CheckpointOrchestrator::ChooseBase(Writing& w) {
  const v1::CheckpointConfig& config = w.job.training().checkpoint();
  w.servers = CheckpointLayout(w.map);
  w.full_step = w.step;
  {
    absl::MutexLock lock(&mu_);
    const int full_every = config.full_every() > 0 ? config.full_every() : 8;
    if (config.incremental() && base_servers_ == w.servers && base_step_ < w.step &&
        increments_ < full_every) {
      w.incremental = true;
      w.base_step = base_step_;
      w.full_step = full_step_;
      w.increments = increments_ + 1;
    }
  }
  w.digest = ckpt::JobConfigDigest(w.job);
}

void CheckpointOrchestrator::NoteNewestComplete(const v1::CheckpointManifest& manifest) {
  if (metrics_ == nullptr) return;
  metrics_->SetLastSuccess(manifest.created_unix_ms() > 0
                               ? manifest.created_unix_ms() / 1000.0
                               : absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
}

void CheckpointOrchestrator::Commit(const Writing& w, const Cut_& cut,
                                    const v1::CheckpointManifest& manifest) {
  {
    absl::MutexLock lock(&mu_);
    base_step_ = w.step;
    full_step_ = w.full_step;
    base_servers_ = w.servers;
    increments_ = w.incremental ? w.increments : 0;
    last_complete_step_ = w.step;
    last_error_.clear();
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - w.started);
  if (metrics_ != nullptr) {
    metrics_->written.Increment();
    metrics_->last_step.Set(static_cast<double>(w.step));
    metrics_->write_seconds.Observe(seconds);
  }
  NoteNewestComplete(manifest);
  int64_t rows = 0;
  for (const v1::CheckpointFile& f : manifest.files()) rows += f.rows();
  LogInfo("checkpoint at step ", w.step, " complete (",
          w.incremental ? absl::StrCat("incremental on step ", w.base_step) : "full", ", ",
          rows, " rows, ", manifest.files_size(), " row files, ",
          absl::StrFormat("%.2f", seconds), " s, ", cut.reason, "): ", w.step_dir);
  const v1::CheckpointConfig& config = w.job.training().checkpoint();
  const int keep_last = config.keep_last() > 0 ? config.keep_last() : 3;
  absl::StatusOr<std::vector<std::string>> pruned =
      ckpt::PruneCheckpoints(w.root, keep_last, options_.file_system);
  if (!pruned.ok()) {
    LogWarning("pruning ", w.root, " to the last ", keep_last, " checkpoints: ",
               pruned.status().message());
  } else if (!pruned->empty()) {
    LogInfo("removed ", absl::StrJoin(*pruned, ", "), " (keep_last ", keep_last, ")");
  }
}

absl::Status CheckpointOrchestrator::SnapshotAll(
    const v1::ShardMap& map, const std::string& step_dir,
    uint64_t step, bool incremental, uint64_t base_step, const std::string& digest,
    int64_t* rows_total) {
  const int n = map.servers_size();
  const std::vector<bool> owns = OwnsRows(map);
  std::vector<absl::StatusOr<v1::SaveRowsResponse>> results(
      n, absl::UnknownError("not called"));
  RunEachOnItsOwnThread(n, [&](int i) {
    if (!owns[i]) {
      results[i] = v1::SaveRowsResponse();
      return;
    }
    v1::SaveRowsRequest request;
    request.set_step(step);
    request.set_path(JoinPath(step_dir, absl::StrFormat("shard-%05d.sst", i)));
    request.set_incremental(incremental);
    request.set_base_step(base_step);
    request.set_shard(static_cast<uint32_t>(i));
    request.set_job_config_digest(digest);
    results[i] = rpc_->SaveRows(map.servers(i), request, options_.snapshot_timeout);
  });
  *rows_total = 0;
  std::vector<std::string> errors;
  for (int i = 0; i < n; ++i) {
    if (results[i].ok()) {
      *rows_total += results[i]->rows();
    } else if (!absl::IsAlreadyExists(results[i].status())) {
      // ALREADY_EXISTS: it took this step's snapshot before (a retried cut
      // after a coordinator restart); its status says how the file is doing.
      errors.push_back(absl::StrCat("shard server ", map.servers(i), " (shard ", i,
                                    "): ", results[i].status().message()));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (progress_.has_value()) {
      progress_->rows_total = *rows_total;
      progress_->files_total = n;
    }
  }
  if (errors.empty()) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  for (int i = 0; i < n; ++i) {
    if (!results[i].ok() && !absl::IsAlreadyExists(results[i].status())) {
      code = results[i].status().code();
      break;
    }
  }
  return absl::Status(code, absl::StrCat("snapshot: ", absl::StrJoin(errors, "; "),
                                         incremental ? " (an incremental checkpoint; "
                                                       "the next one is full)"
                                                     : ""));
}

absl::StatusOr<std::vector<v1::CheckpointFile>> CheckpointOrchestrator::AwaitFiles(
    const v1::ShardMap& map, uint64_t step) {
  const int n = map.servers_size();
  const std::vector<bool> owns = OwnsRows(map);
  std::vector<std::optional<v1::CheckpointFile>> files(n);
  std::vector<absl::Time> last_answer(n, absl::Now());
  const absl::Time deadline = absl::Now() + options_.write_timeout;
  v1::SaveRowsStatusRequest request;
  request.set_step(step);
  while (true) {
    int done = 0;
    int64_t rows_written = 0;
    for (int i = 0; i < n; ++i) {
      if (!owns[i]) {
        ++done;  // nothing to save
        continue;
      }
      if (files[i].has_value()) {
        ++done;
        rows_written += files[i]->rows();
        continue;
      }
      const std::string& address = map.servers(i);
      absl::StatusOr<v1::SaveRowsStatusResponse> status =
          rpc_->SaveRowsStatus(address, request, std::min(options_.unreachable_timeout,
                                                          absl::Seconds(10)));
      const absl::Time now = absl::Now();
      if (!status.ok()) {
        if ((absl::IsUnavailable(status.status()) ||
             absl::IsDeadlineExceeded(status.status())) &&
            now - last_answer[i] < options_.unreachable_timeout) {
          continue;
        }
        return absl::Status(status.status().code(),
                            absl::StrCat("shard server ", address, " (shard ", i,
                                         ") while writing its row file: ",
                                         status.status().message()));
      }
      last_answer[i] = now;
      switch (status->state()) {
        case v1::SaveRowsStatusResponse::DONE:
          files[i] = status->file();
          files[i]->set_shard(static_cast<uint32_t>(i));
          ++done;
          rows_written += files[i]->rows();
          break;
        case v1::SaveRowsStatusResponse::FAILED: {
          // The server's own code (RESOURCE_EXHAUSTED for a full disk); a
          // server that reports none (older) gives INTERNAL: a failed write
          // is not damaged data.
          const int code = status->error_code();
          return absl::Status(
              code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                  ? static_cast<absl::StatusCode>(code)
                  : absl::StatusCode::kInternal,
              absl::StrCat("shard server ", address, " (shard ", i, "): ", status->error()));
        }
        case v1::SaveRowsStatusResponse::WRITING:
          rows_written += status->rows_written();
          break;
        default:
          return absl::FailedPreconditionError(absl::StrCat(
              "shard server ", address, " (shard ", i, ") has no snapshot of step ",
              step, " (did it restart?)"));
      }
    }
    absl::MutexLock lock(&mu_);
    if (progress_.has_value()) {
      progress_->rows_written = rows_written;
      progress_->files_done = done;
      progress_->files_total = n;
    }
    if (done == n) break;
    if (stop_) return absl::CancelledError("the coordinator is stopping");
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          done, " of ", n, " row files written after ",
          absl::FormatDuration(options_.write_timeout), " (--checkpoint_write_timeout)"));
    }
    mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll_interval);
  }
  std::vector<v1::CheckpointFile> out;
  out.reserve(n);
  for (auto& f : files) {
    if (f.has_value()) out.push_back(*std::move(f));
  }
  return out;
}

}  // namespace recps::server

// --restore: the checkpoint and its chain checked at start, the rows
// restored on every shard server once the first map is on all of them, the
// workers' resume state. Also the refusal to overwrite checkpoints, and the
// listing.
#include <algorithm>
#include <filesystem>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "server/checkpoint/chain.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/manifest.h"
#include "server/coordinator/checkpoint_contents.h"
#include "server/coordinator/checkpoint_orchestrator.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_store.h"

namespace recps::server {
namespace {

namespace fs = std::filesystem;
namespace ckpt = checkpoint;

// Set once the servers restored a checkpoint for this job: a restarted
// coordinator (same --state_dir, same --restore) then accepts servers that
// refuse to restore again because they hold rows.
constexpr char kRestoredKey[] = "checkpoint/restored";
// A dense state larger than this is not one (gRPC messages stop at 2 GiB).
constexpr int64_t kMaxDenseBytes = int64_t{2} << 30;

// std::filesystem, not the seam: resolving paths (links, "..") is no file
// operation a test would make fail.
bool SameDir(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const fs::path ca = fs::weakly_canonical(a, ec1);
  const fs::path cb = fs::weakly_canonical(b, ec2);
  return !ec1 && !ec2 && ca == cb;
}

std::string StepList(const std::vector<ckpt::CheckpointInfo>& list) {
  std::vector<uint64_t> steps;
  for (const auto& c : list) steps.push_back(c.step);
  if (steps.size() > 12) {
    return absl::StrCat(absl::StrJoin(steps.begin(), steps.begin() + 12, ", "), ", ...");
  }
  return absl::StrJoin(steps, ", ");
}

}  // namespace

absl::Status CheckpointOrchestrator::Start() {
  absl::StatusOr<v1::JobConfig> job = coordinator_->GetJob();
  if (options_.restore.empty()) {
    if (!job.ok() || job->training().checkpoint().dir().empty()) return absl::OkStatus();
    return CheckNoCheckpoints(*job);
  }
  if (!job.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--restore=", options_.restore, " needs the job (--job=FILE): ",
        job.status().message()));
  }
  std::vector<uint64_t> skipped;
  ASSIGN_OR_RETURN(Restore restore,
                   ResolveRestore(options_.restore, *job, std::nullopt, &skipped));
  const v1::CheckpointManifest& m = restore.manifest;
  LogInfo("restoring step ", m.step(), " from ", absl::StrJoin(restore.chain, ", "),
          " (", m.files_size(), " row files saved by ", m.shard_map().servers_size(),
          " shard servers; ", m.workers_size(), " workers)");
  absl::MutexLock lock(&mu_);
  damaged_steps_.insert(skipped.begin(), skipped.end());
  restore_spec_ = options_.restore;
  AdoptRestore(std::move(restore));
  restore_queued_ = true;
  return absl::OkStatus();
}

void CheckpointOrchestrator::AdoptRestore(Restore restore) {
  const v1::CheckpointManifest& m = restore.manifest;
  base_step_ = m.step();
  full_step_ = m.kind() == v1::CHECKPOINT_KIND_INCREMENTAL ? m.full_step() : m.step();
  increments_ = static_cast<int>(restore.chain.size()) - 1;
  last_complete_step_ = m.step();
  NoteNewestComplete(m);
  restore_ = std::move(restore);
}

absl::Status CheckpointOrchestrator::CheckNoCheckpoints(const v1::JobConfig& job) {
  const std::string& root = job.training().checkpoint().dir();
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list =
      ckpt::ListCheckpoints(root, options_.file_system);
  if (absl::IsNotFound(list.status())) return absl::OkStatus();
  if (!list.ok()) {
    return absl::Status(list.status().code(),
                        absl::StrCat("training.checkpoint.dir: ", list.status().message()));
  }
  if (list->empty()) return absl::OkStatus();
  if (coordinator_->JobStarted()) {
    // A restart of this coordinator: its servers and workers carry on.
    LogInfo(root, " holds checkpoints (steps ", StepList(*list),
            ") of an earlier run of this coordinator; the running job goes on");
    return absl::OkStatus();
  }
  const std::string digest = ckpt::JobConfigDigest(job);
  const bool same_job = list->back().manifest.job_config_digest() == digest;
  return absl::FailedPreconditionError(absl::StrCat(
      "training.checkpoint.dir ", root, " already holds ", list->size(),
      " complete checkpoint(s) (steps ", StepList(*list), ") of ",
      same_job ? "this job" : "another job",
      "; a fresh run would overwrite them. Pass --restore=latest to continue from "
      "the newest (recps local/launch --resume), or use an empty directory"));
}

absl::StatusOr<CheckpointOrchestrator::Restore> CheckpointOrchestrator::ResolveRestore(
    const std::string& spec, const v1::JobConfig& job, std::optional<uint64_t> below,
    std::vector<uint64_t>* skipped_steps) const {
  auto error = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("--restore=", spec, ": ", s.message()));
  };
  ckpt::CheckpointRef ref;
  if (spec == "latest") {
    ref.root = job.training().checkpoint().dir();
    if (ref.root.empty()) {
      return absl::InvalidArgumentError(
          "--restore=latest needs training.checkpoint.dir in the job; or give "
          "--restore=DIR[@STEP]");
    }
  } else {
    absl::StatusOr<ckpt::CheckpointRef> parsed = ckpt::ParseCheckpointRef(spec);
    if (!parsed.ok()) return error(parsed.status());
    ref = *std::move(parsed);
  }
  bool damaged = false;
  if (ref.step.has_value()) {
    // The step asked for, or nothing: no fallback to another one.
    absl::StatusOr<Restore> restore = CheckRestore(job, ref, &damaged);
    if (!restore.ok()) return error(restore.status());
    return restore;
  }
  // The newest intact checkpoint (below `below`): a damaged newer one is
  // skipped, saying why, as long as an older one restores.
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list =
      ckpt::ListCheckpoints(ref.root, options_.file_system);
  if (!list.ok()) return error(list.status());
  if (list->empty()) {
    return error(absl::NotFoundError(absl::StrCat(
        "no complete checkpoint under ", ref.root,
        " (a directory without a valid MANIFEST is not one)")));
  }
  std::vector<std::string> skipped;
  for (auto it = list->rbegin(); it != list->rend(); ++it) {
    if (below.has_value() && it->step >= *below) continue;
    absl::StatusOr<Restore> restore = CheckRestore(job, {ref.root, it->step}, &damaged);
    if (restore.ok()) return restore;
    if (!damaged) return error(restore.status());
    LogWarning("--restore=", spec, ": skipping the checkpoint at step ", it->step, " (",
               it->dir, "): ", restore.status().message(), "; trying an older one");
    skipped.push_back(absl::StrCat("step ", it->step, ": ", restore.status().message()));
    if (skipped_steps != nullptr) skipped_steps->push_back(it->step);
  }
  return error(absl::DataLossError(absl::StrCat(
      "no intact checkpoint under ", ref.root,
      below.has_value() ? absl::StrCat(" older than step ", *below) : "",
      skipped.empty() ? "" : absl::StrCat(" (", absl::StrJoin(skipped, "; "), ")"))));
}

absl::StatusOr<CheckpointOrchestrator::Restore> CheckpointOrchestrator::CheckRestore(
    const v1::JobConfig& job, const ckpt::CheckpointRef& ref, bool* damaged) const {
  Restore restore;
  restore.root = ref.root;
  // A broken chain or a damaged dense state is the checkpoint's fault (an
  // older one may do); another job or world size is the run's.
  *damaged = true;
  ASSIGN_OR_RETURN(const std::vector<ckpt::CheckpointInfo> resolved,
                   ckpt::ResolveChain(ref, options_.file_system));
  const std::string digest = ckpt::JobConfigDigest(job);
  const ckpt::CheckpointInfo* target = &resolved.back();
  // The newest first: the checkpoint asked for is the one to name.
  for (auto it = resolved.rbegin(); it != resolved.rend(); ++it) {
    if (it->manifest.job_config_digest() != digest) {
      *damaged = false;
      return absl::FailedPreconditionError(absl::StrCat(
          JoinPath(it->dir, ckpt::kManifestName), " was written by another job (config digest ",
          it->manifest.job_config_digest(), ", this job's is ", digest,
          "): the tables, model or data differ; restore it with the job that wrote it"));
    }
  }
  restore.chain = ckpt::ChainDirs(resolved);
  restore.manifest = target->manifest;
  const v1::CheckpointManifest& m = restore.manifest;
  if (world_size_ > 0 && m.workers_size() > 0 && m.workers_size() != world_size_) {
    *damaged = false;
    return absl::FailedPreconditionError(absl::StrCat(
        JoinPath(target->dir, ckpt::kManifestName), " holds the data positions of ",
        m.workers_size(), " workers; this job runs ", world_size_,
        " (--world_size): resume with the same number of workers"));
  }
  if (m.has_dense() && !m.dense().name().empty()) {
    const std::string path = JoinPath(target->dir, m.dense().name());
    ASSIGN_OR_RETURN(std::string bytes,
                     options_.file_system->ReadSmallFile(path, kMaxDenseBytes));
    if (bytes.size() != m.dense().size_bytes()) {
      return absl::DataLossError(absl::StrCat(
          path, " has ", bytes.size(), " bytes, its manifest says ",
          m.dense().size_bytes(), ": the file is truncated or damaged"));
    }
    if (ckpt::Crc32cExtend(0, bytes.data(), bytes.size()) != m.dense().crc32c()) {
      return absl::DataLossError(
          absl::StrCat(path, ": CRC-32C mismatch, the file is damaged"));
    }
    restore.dense_state = std::move(bytes);
  }
  return restore;
}

void CheckpointOrchestrator::RunRestore(bool replace) {
  const absl::Time deadline = absl::Now() + options_.restore_timeout;
  std::vector<std::string> chain;
  uint64_t step = 0;
  std::string root;
  std::string spec;
  {
    absl::MutexLock lock(&mu_);
    chain = restore_->chain;
    step = restore_->manifest.step();
    root = restore_->root;
    spec = restore_spec_;
  }
  auto fail = [&](const absl::Status& s) {
    const absl::Status failure(
        s.code(), absl::StrCat("restoring step ", step, " from ", chain.back(), ": ",
                               s.message()));
    LogError(failure.message());
    absl::MutexLock lock(&mu_);
    restore_failure_ = failure;
  };
  // Wait until a map exists and every server routes by it.
  v1::ShardMap map;
  std::vector<bool> ready;
  while (true) {
    if (map.epoch() == 0) {
      absl::StatusOr<v1::ShardMap> m = coordinator_->GetShardMap();
      if (m.ok()) {
        map = *std::move(m);
        ready.assign(map.servers_size(), false);
      }
    }
    bool all = map.epoch() != 0;
    for (int i = 0; i < map.servers_size(); ++i) {
      if (ready[i]) continue;
      absl::StatusOr<uint64_t> epoch =
          rpc_->ShardMapEpoch(map.servers(i), absl::Seconds(5));
      ready[i] = epoch.ok() && *epoch >= map.epoch();
      all = all && ready[i];
    }
    if (all) break;
    bool timed_out = false;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      timed_out = absl::Now() > deadline;
      if (!timed_out) mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll_interval);
    }
    if (timed_out) {
      return fail(absl::DeadlineExceededError(absl::StrCat(
          "the shard map was not on every shard server within ",
          absl::FormatDuration(options_.restore_timeout))));
    }
  }
  // A rollback replaces whatever the servers hold.
  const bool restored_before = !replace && store_->Get(kRestoredKey).ok();
  absl::StatusOr<v1::JobConfig> job = coordinator_->GetJob();
  if (!job.ok()) return fail(job.status());
  // --restore without a step may fall back to an older checkpoint when the
  // servers find this one damaged; not after a restore by an earlier
  // process of this coordinator (its servers hold that step's rows).
  absl::StatusOr<ckpt::CheckpointRef> ref = ckpt::ParseCheckpointRef(spec);
  const bool may_fall_back =
      !restored_before && (spec == "latest" || (ref.ok() && !ref->step.has_value()));
  int64_t rows = 0;
  while (true) {
    v1::RestoreRowsRequest request;
    for (const std::string& dir : chain) request.add_checkpoint_dirs(dir);
    request.set_expected_digest(ckpt::JobConfigDigest(*job));
    request.set_step(step);
    request.set_replace(replace);
    const int n = map.servers_size();
    std::vector<absl::StatusOr<v1::RestoreRowsResponse>> results(
        n, absl::UnknownError("not called"));
    RunEachOnItsOwnThread(n, [&](int i) {
      results[i] = rpc_->RestoreRows(map.servers(i), request, options_.restore_timeout);
    });
    std::vector<std::string> errors;
    // Every server checks every file of the chain before it imports a row:
    // when all of them refused a damaged or missing file, all are still
    // empty and an older checkpoint can be restored instead.
    bool damaged = may_fall_back;
    rows = 0;
    for (int i = 0; i < n; ++i) {
      if (results[i].ok()) {
        rows += results[i]->rows();
        damaged = false;
      } else if (restored_before && absl::IsFailedPrecondition(results[i].status())) {
        LogInfo("shard server ", map.servers(i), " keeps its rows (",
                results[i].status().message(),
                "): this coordinator restarted after the restore");
        damaged = false;
      } else {
        errors.push_back(absl::StrCat("shard server ", map.servers(i), ": ",
                                      results[i].status().message()));
        damaged = damaged && (absl::IsDataLoss(results[i].status()) ||
                              absl::IsNotFound(results[i].status()));
      }
    }
    if (errors.empty()) break;
    absl::StatusCode code = absl::StatusCode::kUnavailable;
    for (int i = 0; i < n; ++i) {
      if (!results[i].ok()) code = results[i].status().code();
    }
    const absl::Status failure(code, absl::StrJoin(errors, "; "));
    if (!damaged) return fail(failure);
    std::vector<uint64_t> skipped = {step};
    absl::StatusOr<Restore> older = ResolveRestore(spec, *job, step, &skipped);
    if (!older.ok()) {
      return fail(absl::Status(code, absl::StrCat(failure.message(), "; and ",
                                                  older.status().message())));
    }
    LogWarning("skipping the checkpoint at step ", step, " (", chain.back(),
               "): the shard servers refused it: ", failure.message(),
               "; restoring the newest intact older one, step ", older->manifest.step(),
               " (", older->chain.back(), ")");
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    damaged_steps_.insert(skipped.begin(), skipped.end());
    chain = older->chain;
    step = older->manifest.step();
    AdoptRestore(*std::move(older));
  }
  if (absl::Status s = store_->Put(kRestoredKey, absl::StrCat(step)); !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<v1::JobConfig> current = coordinator_->GetJob();
  const bool same_root =
      current.ok() && SameDir(root, current->training().checkpoint().dir());
  LogInfo("restored step ", step, ": ", rows, " rows onto ", map.servers_size(),
          " shard server(s)");
  absl::MutexLock lock(&mu_);
  restored_ = true;
  // Increments chain to the restored checkpoint only within the same root.
  if (same_root) base_servers_ = CheckpointLayout(map);
}

absl::StatusOr<v1::GetResumeStateResponse> CheckpointOrchestrator::ResumeState(
    int32_t rank) const {
  if (rank < 0 || (world_size_ > 0 && rank >= world_size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume state: rank ", rank, " is outside [0, ", world_size_, ") (--world_size)"));
  }
  v1::GetResumeStateResponse response;
  absl::MutexLock lock(&mu_);
  if (rollback_ != Rollback::kNone) return RollbackUnavailable();
  if (!restore_failure_.ok()) return restore_failure_;
  if (!restore_.has_value()) return response;  // resume = false
  const v1::CheckpointManifest& m = restore_->manifest;
  if (!restored_) {
    return absl::UnavailableError(absl::StrCat(
        "the shard servers are still restoring step ", m.step(), " from ",
        restore_->chain.back()));
  }
  response.set_resume(true);
  response.set_step(m.step());
  response.set_dense_state(restore_->dense_state);
  response.set_dir(restore_->chain.back());
  if (rank < m.workers_size()) {
    *response.mutable_position() = m.workers(rank);
  } else {
    // No position saved: skip the batches of the steps completed.
    response.mutable_position()->set_rank(rank);
    response.mutable_position()->set_batches_read(static_cast<int64_t>(m.step()));
  }
  return response;
}

absl::StatusOr<v1::ListCheckpointsResponse> CheckpointOrchestrator::List() const {
  v1::ListCheckpointsResponse response;
  absl::StatusOr<v1::JobConfig> job = coordinator_->GetJob();
  if (!job.ok()) return job.status();
  const std::string root = job->training().checkpoint().dir();
  response.set_root(root);
  {
    absl::MutexLock lock(&mu_);
    response.set_last_error(last_error_);
    if (restore_.has_value()) response.set_restored_step(restore_->manifest.step());
    if (progress_.has_value()) {
      v1::CheckpointProgress* p = response.mutable_in_progress();
      p->set_step(progress_->step);
      p->set_rows_written(progress_->rows_written);
      p->set_rows_total(progress_->rows_total);
      p->set_files_done(progress_->files_done);
      p->set_files_total(progress_->files_total);
      p->set_started_unix_ms(absl::ToUnixMillis(progress_->started));
    }
  }
  if (root.empty()) return response;
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list =
      ckpt::ListCheckpoints(root, options_.file_system);
  if (absl::IsNotFound(list.status())) return response;  // none written yet
  if (!list.ok()) return list.status();
  for (const ckpt::CheckpointInfo& info : *list) {
    v1::CheckpointSummary* s = response.add_checkpoints();
    const v1::CheckpointManifest& m = info.manifest;
    s->set_step(info.step);
    s->set_kind(m.kind());
    s->set_base_step(m.base_step());
    int64_t size = static_cast<int64_t>(m.dense().size_bytes());
    int64_t rows = 0;
    for (const v1::CheckpointFile& f : m.files()) {
      size += static_cast<int64_t>(f.size_bytes());
      rows += f.rows();
    }
    // std::filesystem: the seam has no stat, and the size is only shown.
    std::error_code ec;
    const uintmax_t manifest_bytes =
        fs::file_size(JoinPath(info.dir, ckpt::kManifestName), ec);
    if (!ec) size += static_cast<int64_t>(manifest_bytes);
    s->set_size_bytes(size);
    s->set_rows(rows);
    s->set_created_unix_ms(m.created_unix_ms());
    s->set_dir(info.dir);
    s->set_reason(m.reason());
  }
  return response;
}

}  // namespace recps::server

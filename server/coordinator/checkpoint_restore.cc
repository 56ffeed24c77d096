// --restore: the checkpoint and its chain checked at start, the rows
// restored on every shard server once the first map is on all of them, the
// workers' resume state. Also the refusal to overwrite checkpoints.
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
#include "server/checkpoint/chain.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/file_util.h"
#include "server/checkpoint/manifest.h"
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

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

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
  ASSIGN_OR_RETURN(Restore restore, ResolveRestore(*job));
  const v1::CheckpointManifest& m = restore.manifest;
  LogInfo("restoring step ", m.step(), " from ", absl::StrJoin(restore.chain, ", "),
          " (", m.files_size(), " row files saved by ", m.shard_map().servers_size(),
          " shard servers; ", m.workers_size(), " workers)");
  absl::MutexLock lock(&mu_);
  base_step_ = m.step();
  full_step_ = m.kind() == v1::CHECKPOINT_KIND_INCREMENTAL ? m.full_step() : m.step();
  increments_ = static_cast<int>(restore.chain.size()) - 1;
  last_complete_step_ = m.step();
  restore_ = std::move(restore);
  restore_queued_ = true;
  return absl::OkStatus();
}

absl::Status CheckpointOrchestrator::CheckNoCheckpoints(const v1::JobConfig& job) {
  const std::string& root = job.training().checkpoint().dir();
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = ckpt::ListCheckpoints(root);
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
    const v1::JobConfig& job) const {
  const std::string& spec = options_.restore;
  Restore restore;
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
  restore.root = ref.root;
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> resolved = ckpt::ResolveChain(ref);
  if (!resolved.ok()) return error(resolved.status());
  const std::string digest = ckpt::JobConfigDigest(job);
  std::vector<const ckpt::CheckpointInfo*> chain;
  for (const ckpt::CheckpointInfo& c : *resolved) chain.push_back(&c);
  const ckpt::CheckpointInfo* target = chain.back();
  // The newest first: the checkpoint asked for is the one to name.
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const ckpt::CheckpointInfo* c = *it;
    if (c->manifest.job_config_digest() != digest) {
      return error(absl::FailedPreconditionError(absl::StrCat(
          JoinPath(c->dir, ckpt::kManifestName), " was written by another job (config digest ",
          c->manifest.job_config_digest(), ", this job's is ", digest,
          "): the tables, model or data differ; restore it with the job that wrote it")));
    }
  }
  restore.chain = ckpt::ChainDirs(*resolved);
  restore.manifest = target->manifest;
  const v1::CheckpointManifest& m = restore.manifest;
  if (world_size_ > 0 && m.workers_size() > 0 && m.workers_size() != world_size_) {
    return error(absl::FailedPreconditionError(absl::StrCat(
        JoinPath(target->dir, ckpt::kManifestName), " holds the data positions of ",
        m.workers_size(), " workers; this job runs ", world_size_,
        " (--world_size): resume with the same number of workers")));
  }
  if (m.has_dense() && !m.dense().name().empty()) {
    const std::string path = JoinPath(target->dir, m.dense().name());
    absl::StatusOr<std::string> bytes = ckpt::ReadSmallFile(path, kMaxDenseBytes);
    if (!bytes.ok()) return error(bytes.status());
    if (bytes->size() != m.dense().size_bytes()) {
      return error(absl::DataLossError(absl::StrCat(
          path, " has ", bytes->size(), " bytes, its manifest says ",
          m.dense().size_bytes(), ": the file is truncated or damaged")));
    }
    if (ckpt::Crc32cExtend(0, bytes->data(), bytes->size()) != m.dense().crc32c()) {
      return error(absl::DataLossError(
          absl::StrCat(path, ": CRC-32C mismatch, the file is damaged")));
    }
    restore.dense_state = *std::move(bytes);
  }
  return restore;
}

void CheckpointOrchestrator::RunRestore() {
  const absl::Time deadline = absl::Now() + options_.restore_timeout;
  std::vector<std::string> chain;
  uint64_t step = 0;
  std::string root;
  {
    absl::MutexLock lock(&mu_);
    chain = restore_->chain;
    step = restore_->manifest.step();
    root = restore_->root;
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
  const bool restored_before = store_->Get(kRestoredKey).ok();
  absl::StatusOr<v1::JobConfig> job = coordinator_->GetJob();
  if (!job.ok()) return fail(job.status());
  v1::RestoreRowsRequest request;
  for (const std::string& dir : chain) request.add_checkpoint_dirs(dir);
  request.set_expected_digest(ckpt::JobConfigDigest(*job));
  request.set_step(step);
  const int n = map.servers_size();
  std::vector<absl::StatusOr<v1::RestoreRowsResponse>> results(
      n, absl::UnknownError("not called"));
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        results[i] = rpc_->RestoreRows(map.servers(i), request, options_.restore_timeout);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  std::vector<std::string> errors;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    if (results[i].ok()) {
      rows += results[i]->rows();
    } else if (restored_before && absl::IsFailedPrecondition(results[i].status())) {
      LogInfo("shard server ", map.servers(i), " keeps its rows (",
              results[i].status().message(),
              "): this coordinator restarted after the restore");
    } else {
      errors.push_back(absl::StrCat("shard server ", map.servers(i), ": ",
                                    results[i].status().message()));
    }
  }
  if (!errors.empty()) {
    absl::StatusCode code = absl::StatusCode::kUnavailable;
    for (int i = 0; i < n; ++i) {
      if (!results[i].ok()) code = results[i].status().code();
    }
    return fail(absl::Status(code, absl::StrJoin(errors, "; ")));
  }
  if (absl::Status s = store_->Put(kRestoredKey, absl::StrCat(step)); !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<v1::JobConfig> current = coordinator_->GetJob();
  const bool same_root =
      current.ok() && SameDir(root, current->training().checkpoint().dir());
  LogInfo("restored step ", step, ": ", rows, " rows onto ", n, " shard server(s)");
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
  if (!restore_.has_value()) return response;  // resume = false
  if (!restore_failure_.ok()) return restore_failure_;
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

}  // namespace recps::server

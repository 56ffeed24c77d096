#include "worker/worker_checkpoints.h"

#include <signal.h>

#include <atomic>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "worker/model/dense_state.h"
#include "worker/worker_setup.h"

namespace recps::worker {
namespace {

// Set by SIGTERM/SIGINT when checkpoints are on: the trainer checkpoints at
// the next step boundary (agreed with the other workers) and returns.
std::atomic<bool> g_stop_requested{false};

void OnStopSignal(int sig) {
  // A second signal does not wait for the checkpoint.
  if (g_stop_requested.exchange(true)) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void InstallStopHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

}  // namespace

WorkerCheckpoints::WorkerCheckpoints(int rank, const v1::JobConfig& job,
                                     client::CoordinatorClient* coordinator,
                                     client::CoordinatorLease* lease,
                                     absl::Duration cut_timeout)
    : rank_(rank),
      total_steps_(job.training().steps()),
      every_steps_(job.training().checkpoint().every_steps()),
      coordinator_(coordinator),
      lease_(lease),
      cut_timeout_(cut_timeout),
      enabled_(coordinator != nullptr && !job.training().checkpoint().dir().empty()) {
  if (enabled_) InstallStopHandler();
}

bool WorkerCheckpoints::StopSignalledHere() { return g_stop_requested.load(); }

int WorkerCheckpoints::Resume() {
  if (coordinator_ == nullptr) return 0;
  absl::StatusOr<v1::GetResumeStateResponse> resume = FetchResumeState(*coordinator_, rank_);
  if (!resume.ok() && resume.status().code() == absl::StatusCode::kUnimplemented) {
    LogWarning("the coordinator does not know GetResumeState (older version): starting "
               "from step 0");
  } else if (!resume.ok()) {
    LogError("asking the coordinator where to resume failed: ", resume.status().ToString());
    return 1;
  } else if (resume->resume()) {
    start_step_ = static_cast<int64_t>(resume->step());
    batches_read_ = resume->position().batches_read();
    if (!resume_dense_.ParseFromString(resume->dense_state())) {
      LogError("the dense state of checkpoint ", resume->dir(), " (step ", start_step_,
               ") does not parse as recps.v1.DenseState");
      return 1;
    }
    if (start_step_ > total_steps_) {
      LogError("checkpoint ", resume->dir(), " is at step ", start_step_,
               ", past this job's training.steps ", total_steps_);
      return 2;
    }
    if (batches_read_ != start_step_) {
      LogWarning("checkpoint ", resume->dir(), ": rank ", rank_, " had read ",
                 batches_read_, " batches at step ", start_step_,
                 "; resuming its data there");
    }
  }
  return 0;
}

int WorkerCheckpoints::SkipTrainedData(BatchSource& train) const {
  if (batches_read_ <= 0) return 0;
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> skipped = train.Skip(batches_read_);
  if (!skipped.ok()) {
    LogError("skipping the ", batches_read_, " batches trained before the checkpoint: ",
             skipped.status().ToString());
    return 1;
  }
  if (*skipped < batches_read_) {
    LogError("the training data ends after ", *skipped, " batches, but the checkpoint "
             "says rank ", rank_, " read ", batches_read_);
    return 2;
  }
  LogInfo(absl::StrFormat("data position: skipped %d batches in %.2f s", batches_read_,
                          absl::ToDoubleSeconds(absl::Now() - start)));
  return 0;
}

void WorkerCheckpoints::Wire(TrainerOptions* options) {
  options->start_step = start_step_;
  if (!enabled_) return;
  options->checkpoint_every = every_steps_;
  options->stop_requested = [] { return g_stop_requested.load(); };
  client::CoordinatorLease* const lease = lease_;
  options->checkpoint_request_id = [lease] { return lease->checkpoint_request_id(); };
  options->checkpoint = [this](const CheckpointCutInfo& info) { return Cut(info); };
}

absl::Status WorkerCheckpoints::Cut(const CheckpointCutInfo& info) {
  const absl::Time start = absl::Now();
  v1::CheckpointCutRequest request;
  request.set_member_id(lease_->member_id());
  request.set_rank(rank_);
  request.set_step(static_cast<uint64_t>(info.step));
  if (rank_ == 0) request.set_dense_state(info.dense.SerializeAsString());
  request.mutable_position()->set_rank(rank_);
  request.mutable_position()->set_batches_read(info.batches_read);
  request.set_wait_complete(info.wait_complete);
  request.set_reason(info.reason);
  absl::StatusOr<v1::CheckpointCutResponse> cut =
      coordinator_->CheckpointCut(request, cut_timeout_);
  if (!cut.ok() && !info.wait_complete) {
    // Every worker gets the same answer (the cut is a barrier): all go
    // on, and the previous complete checkpoint stays the one to resume.
    LogWarning("checkpoint at step ", info.step, " (", info.reason, ") failed; training "
               "goes on and the previous complete checkpoint stays: ",
               cut.status().message());
    return absl::OkStatus();
  }
  if (!cut.ok() && info.reason == "final") {
    // Every step is trained and every worker got this answer: finish
    // (final evaluation, results) and report it then. The previous
    // complete checkpoint stays the newest.
    final_checkpoint_ = absl::Status(
        cut.status().code(), absl::StrCat("final checkpoint at step ", info.step,
                                          " failed: ", cut.status().message()));
    LogError(final_checkpoint_.ToString());
    return absl::OkStatus();
  }
  if (!cut.ok()) {
    return absl::Status(cut.status().code(),
                        absl::StrCat("checkpoint cut at step ", info.step, " (",
                                     info.reason, "): ", cut.status().message()));
  }
  LogInfo(absl::StrFormat("checkpoint at step %d (%s) %s: training stalled %.1f ms",
                          info.step, info.reason,
                          info.wait_complete ? "complete in " + cut->dir()
                                             : "cut, writing " + cut->dir(),
                          1e3 * absl::ToDoubleSeconds(absl::Now() - start)));
  return absl::OkStatus();
}

int WorkerCheckpoints::RestoreDense(Trainer& trainer) const {
  if (start_step_ <= 0) return 0;
  if (absl::Status s = LoadDenseState(resume_dense_, &trainer.model(), &trainer.optimizer());
      !s.ok()) {
    LogError("loading the checkpoint's dense state: ", s.message());
    return 2;
  }
  LogInfo("resuming at step ", start_step_, " of ", total_steps_,
          ": dense model and optimizer loaded, data at batch ", batches_read_);
  return 0;
}

int WorkerCheckpoints::FinalExitCode(int64_t steps) const {
  if (final_checkpoint_.ok()) return 0;
  LogError("trained all ", steps, " steps and wrote the results, but ",
           final_checkpoint_.ToString());
  return kExitFinalCheckpointFailed;
}

}  // namespace recps::worker

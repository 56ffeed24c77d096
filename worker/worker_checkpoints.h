// The worker's half of checkpoints (recps-worker): where a rank resumes,
// the cut the trainer asks for at an agreed step boundary, pre-emption by
// SIGTERM, and the final checkpoint's outcome. The coordinator's half
// (gathering the cut, the manifest) is in server/coordinator; see
// docs/operations.md, "Resume, restart and pre-emption".
#ifndef RECPS_WORKER_WORKER_CHECKPOINTS_H_
#define RECPS_WORKER_WORKER_CHECKPOINTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "recps/v1/checkpoint.pb.h"
#include "recps/v1/job.pb.h"
#include "worker/data/batch.h"
#include "worker/trainer.h"

namespace recps::worker {

// Contract: one per rank, made once the job is final (--steps applied) and,
// with --coordinator, once registered; `coordinator` and `lease` (both null
// without a coordinator) outlive it, and it outlives the trainer it wires.
// Checkpoints need the coordinator (it gathers the cut and writes the
// manifest): without one, or with training.checkpoint.dir empty, enabled()
// is false and the run is as without checkpoints. Every step that can fail
// logs why and returns the process's exit code (0: go on), as the rest of
// recps-worker does. Used by the rank's one thread.
//
// Its steps, in the order of a run:
//   constructor       installs the SIGTERM/SIGINT handler when enabled
//   Resume            asks the coordinator where to resume (with one)
//   SkipTrainedData   seeks the training data past the batches read
//   Wire              the trainer's checkpoint options
//   RestoreDense      loads the checkpoint's dense model and optimizer
//   FinalExitCode     kExitFinalCheckpointFailed if the final cut failed
class WorkerCheckpoints {
 public:
  // Whether this process got SIGTERM/SIGINT (its own pre-emption), as
  // opposed to stopping at a pre-emption checkpoint another rank asked for.
  static bool StopSignalledHere();
  // `cut_timeout`: how long one CheckpointCut may take (--checkpoint_timeout).
  WorkerCheckpoints(int rank, const v1::JobConfig& job,
                    client::CoordinatorClient* coordinator,
                    client::CoordinatorLease* lease, absl::Duration cut_timeout);

  WorkerCheckpoints(const WorkerCheckpoints&) = delete;
  WorkerCheckpoints& operator=(const WorkerCheckpoints&) = delete;

  bool enabled() const { return enabled_; }

  // With a coordinator: the step to train from, the dense state and the data
  // position (the coordinator answers "no resume" for a fresh job; one that
  // does not know GetResumeState starts from step 0). 1 when asking fails or
  // the dense state does not parse, 2 for a checkpoint past training.steps.
  int Resume();
  // Steps trained before this run (0: a fresh start) and the training
  // batches this rank had read then.
  int64_t start_step() const { return start_step_; }
  int64_t batches_read() const { return batches_read_; }

  // Skips the batches read before the checkpoint (nothing on a fresh start);
  // call before the prefetch thread starts reading. 1 when skipping fails,
  // 2 when the data ends before.
  int SkipTrainedData(BatchSource& train) const;

  // Sets options->start_step and, when enabled, the checkpoint options: the
  // cut (CheckpointCut at the coordinator), every_steps, the lease's
  // checkpoint requests and the stop signal.
  void Wire(TrainerOptions* options);

  // On a resume (start_step() > 0), loads the checkpoint's dense model and
  // optimizer into `trainer`: 2 when they do not fit the job.
  int RestoreDense(Trainer& trainer) const;

  // After the results are written: 0, or kExitFinalCheckpointFailed (logged)
  // when every step trained but the final checkpoint failed; `steps` are the
  // steps trained, for the message.
  int FinalExitCode(int64_t steps) const;

 private:
  // TrainerOptions::checkpoint: one cut at the coordinator. A periodic or
  // requested cut that fails is a warning (training goes on); a failed final
  // cut is kept for FinalExitCode; any other failure fails the run.
  absl::Status Cut(const CheckpointCutInfo& info);

  const int rank_;
  const int64_t total_steps_;
  const int64_t every_steps_;
  client::CoordinatorClient* const coordinator_;
  client::CoordinatorLease* const lease_;
  const absl::Duration cut_timeout_;
  const bool enabled_;

  int64_t start_step_ = 0;
  int64_t batches_read_ = 0;
  v1::DenseState resume_dense_;
  // The final checkpoint's error: the run still evaluates and reports, then
  // exits kExitFinalCheckpointFailed (the launcher does not retrain).
  absl::Status final_checkpoint_;
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_WORKER_CHECKPOINTS_H_

// The training loop of one worker: per step, read a batch, dedup and look up
// its embeddings on the shard servers, pool them, run the dense DLRM forward
// and backward, push one gradient row per unique id, and step the dense
// optimizer (after the data-parallel hook, which the cluster fills with an
// allreduce). Evaluates on held-out data every eval_interval steps.
#ifndef RECPS_WORKER_TRAINER_H_
#define RECPS_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/dedup.h"
#include "client/embedding_client.h"
#include "kernels/device_memory.h"
#include "kernels/embedding_bag.h"
#include "kernels/exec_context.h"
#include "recps/v1/checkpoint.pb.h"
#include "recps/v1/job.pb.h"
#include "worker/data/batch.h"
#include "worker/eval_metrics.h"
#include "worker/model/dense_optimizer.h"
#include "worker/model/dlrm.h"

namespace recps::worker {

// Seconds spent per phase, summed over steps. When lookups overlap compute
// (bounded and async modes) `lookup` and the pooling part of `forward` run
// on a helper thread beside the rest; `lookup_wait` is what the training
// thread then spent waiting for them, the part of the lookup the overlap
// did not hide. `eval` is the evaluations run during training. In sync
// mode with sync_prefetch, `prefetch` is the lookup of the next step's rows
// on the helper thread (overlapped, not in total()) and `lookup` the
// correction after the push.
struct StepTimes {
  double data = 0, lookup = 0, forward = 0, backward = 0, push = 0,
         allreduce = 0, optimizer = 0, lookup_wait = 0, eval = 0,
         prefetch = 0;
  double total() const {
    return data + lookup + forward + backward + push + allreduce + optimizer;
  }
};

struct EvalRecord {
  int64_t step = 0;  // steps trained before this evaluation
  EvalMetrics metrics;
};

struct TrainResult {
  // Steps completed, counting those before start_step (a resumed run).
  int64_t steps = 0;
  int64_t samples = 0;  // this worker's, in this run
  double seconds = 0;
  double last_loss = 0;
  // This worker's mean loss of every step this run trained (the first is
  // step start_step's).
  std::vector<float> losses;
  // Wall time of every step this run trained, including a checkpoint cut
  // taken at its end and excluding evaluations (the stall measurements),
  // and the samples each trained.
  std::vector<double> step_seconds;
  std::vector<int32_t> step_samples;
  StepTimes times;
  std::vector<EvalRecord> evals;
  // Checkpoint cuts taken and the seconds each stalled training.
  std::vector<int64_t> checkpoint_steps;
  std::vector<double> checkpoint_seconds;
  // Stopped early by TrainerOptions::stop_requested (pre-emption), after a
  // checkpoint at `steps`.
  bool preempted = false;
  // Staleness (client::LookupInfo) of the rows the last step trained on,
  // and the most of any step this run; -1: not known (older servers).
  int64_t last_lookup_staleness = -1;
  int64_t max_lookup_staleness = -1;
};

// What the trainer hands to TrainerOptions::checkpoint at a cut.
struct CheckpointCutInfo {
  // Steps completed: every step before it pushed and acknowledged, no lookup
  // of it issued (or, in bounded and async modes, the one issued early is
  // redone after the cut).
  int64_t step = 0;
  // "periodic", "requested", "preempted" or "final".
  std::string reason;
  // Answer only once the checkpoint is complete (final, pre-empted).
  bool wait_complete = false;
  // The dense model and optimizer (filled on rank 0 only; every replica is
  // the same).
  v1::DenseState dense;
  // Training batches consumed: `step`, one per step.
  int64_t batches_read = 0;
};

struct TrainerOptions {
  int rank = 0;
  int world_size = 1;
  // Where the dense model runs (ctx.device; a CUDA context needs its stream
  // and cuBLAS handle, see kernels::ExecResources). Pooling, the loss and
  // the embedding gradients run on the host with ctx.pool.
  kernels::ExecContext ctx;
  // Data-parallel hook over the dense gradients, called every step before the
  // optimizer; it must leave the global-batch gradient (the sum over workers,
  // each already scaled by 1 / world_size). Null: one worker, identity. The
  // span is memory of ctx.device (GPU memory for CUDA: NCCL), with queued
  // work on ctx's stream complete when it is called.
  std::function<absl::Status(absl::Span<float>)> allreduce;
  // Called after every step and evaluation (progress display, metrics).
  std::function<void(int64_t step, float loss, const TrainResult&)> on_step;
  std::function<void(const EvalRecord&)> on_eval;

  // A resumed run: steps already trained. Run trains steps [start_step,
  // job.training.steps) without the baseline evaluation; the caller loaded
  // the dense state (LoadDenseState) and skipped the data to there.
  int64_t start_step = 0;

  // Checkpoints (null: none, and nothing below is consulted). Called at a
  // step boundary where every worker agreed to cut; must return once the
  // cut is taken (the coordinator's CheckpointCut). An error fails the run.
  std::function<absl::Status(const CheckpointCutInfo&)> checkpoint;
  // Cut after every this many steps (0: only when asked and at the end).
  int64_t checkpoint_every = 0;
  // The lease's checkpoint_request_id: a value larger than at the last cut
  // (or at the start) asks for a cut at the next step boundary.
  std::function<uint64_t()> checkpoint_request_id;
  // True once the process was asked to stop (SIGTERM): cut at the next
  // step boundary with wait_complete, then return with preempted set.
  std::function<bool()> stop_requested;

  // Sync mode: read step t+1's rows while step t computes and pushes, then
  // re-read only the rows step t updated (exactly synchronous; see
  // docs/training.md, Overlap in sync mode). False: look up after the push.
  bool sync_prefetch = true;

  // Pool the looked-up rows with the model's device kernels (on a GPU: each
  // table's distinct rows are copied once, pooled there, and the gradient
  // rows computed there and copied back for the push). False: pooling and
  // its backward run on the host and the pooled tensor is copied. Features
  // that share a table must then share its pooling mode (INVALID_ARGUMENT
  // at Create otherwise).
  bool pool_on_device = false;
};

class Trainer {
 public:
  // `make_eval_source` gives a fresh held-out stream for each evaluation.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const v1::JobConfig& job, std::unique_ptr<client::EmbeddingClient> client,
      std::unique_ptr<BatchSource> train,
      std::function<absl::StatusOr<std::unique_ptr<BatchSource>>()> make_eval_source,
      TrainerOptions options);

  // Trains job.training.steps steps (fewer if the data ends), evaluating
  // every eval_interval steps and at the end.
  absl::StatusOr<TrainResult> Run();

  // One training step on `batch`; returns its mean loss.
  absl::StatusOr<float> TrainStep(const Batch& batch, int64_t step,
                                  StepTimes* times);
  // Metrics over eval_batches held-out batches, looking rows up at `step`.
  absl::StatusOr<EvalMetrics> Evaluate(int64_t step);

  DlrmModel& model() { return *model_; }
  DenseOptimizer& optimizer() { return *optimizer_; }

 private:
  Trainer() = default;

  // Per table (index in the client's tables): ids of every feature using it.
  struct TableState {
    client::Dedup dedup;
    std::vector<float> rows;       // unique x dim
    std::vector<float> grad_rows;  // unique x dim
  };
  // Per feature: its table, pooling and indices into the table's rows.
  struct FeatureState {
    int table = 0;
    kernels::PoolingMode pooling = kernels::PoolingMode::kSum;
    std::vector<int64_t> indices;
  };
  // Everything one batch's lookup produces. Two of them let the lookup of
  // step t+1 run while step t computes (bounded and async modes).
  struct LookupBuffers {
    std::vector<TableState> tables;
    std::vector<FeatureState> features;
    std::vector<float> pooled;  // B x F x D, sample-major
    std::vector<client::LookupSpec> specs;  // of the last lookup
    int64_t staleness = -1;  // of the rows read (client::LookupInfo)
    // pool_on_device: per TableGroup, its features' indices one after the
    // other and their offsets (B bags per feature, shifted), so that one
    // kernel call pools (and differentiates) every feature of a table.
    std::vector<std::vector<int64_t>> group_indices, group_offsets;
  };
  // pool_on_device: the features of one table (in feature order).
  struct TableGroup {
    int table = 0;
    kernels::PoolingMode pooling = kernels::PoolingMode::kSum;
    std::vector<int> features;
  };
  // pool_on_device: a group's buffers on the model's device.
  struct DeviceTable {
    kernels::DeviceBuffer rows, grad_rows;
    kernels::DeviceBuffer bags;  // B * |features| x D: pooled, then its gradient
    kernels::DeviceArray<int64_t> indices, offsets;
  };

  // Looks up and pools `batch`'s embeddings into buf->pooled.
  absl::Status LookupAndPool(const Batch& batch, int64_t step, StepTimes* times,
                             LookupBuffers* buf);
  // Its two halves: dedup the ids per table and read their rows (as a
  // lookup of `step`) into buf; pool buf's rows into buf->pooled.
  absl::Status DedupAndLookup(const Batch& batch, int64_t step,
                              StepTimes* times, LookupBuffers* buf);
  absl::Status Pool(const Batch& batch, StepTimes* times, LookupBuffers* buf);
  // Sync prefetch: re-reads the rows of buf that step `step - 1` updated
  // (EmbeddingClient::LookupUpdated), all of them if the shard map moved
  // since `prefetch_epoch`, then pools.
  absl::Status CorrectAndPool(const Batch& batch, int64_t step,
                              uint64_t prefetch_epoch, StepTimes* times,
                              LookupBuffers* buf);
  // pool_on_device: buf's rows pooled on the device into the model's pooled
  // input, then the model's forward (logits to logits_).
  absl::Status DeviceForward(const Batch& batch, LookupBuffers* buf);
  // pool_on_device: the model's backward from grad_logits_, then the
  // gradient rows of every table into buf's grad_rows (host).
  absl::Status DeviceBackward(const Batch& batch, LookupBuffers* buf);
  // Forward, backward, push and optimizer for a looked-up batch.
  absl::StatusOr<float> Compute(const Batch& batch, int64_t step,
                                StepTimes* times, LookupBuffers* buf);
  // Compute's steps. The model's forward and the loss (gradient of the
  // logits into grad_logits_); returns the batch's mean loss.
  absl::StatusOr<float> ForwardLoss(const Batch& batch, StepTimes* times,
                                    LookupBuffers* buf);
  // The gradients: the model's dense ones and buf's embedding gradient rows.
  absl::Status Backward(const Batch& batch, StepTimes* times, LookupBuffers* buf);
  // Backward's host half without pool_on_device: the model's backward, then
  // each feature's pooled gradient into its table's gradient rows.
  absl::Status HostBackward(const Batch& batch, LookupBuffers* buf);
  // Pushes buf's gradient rows as step `step` beside the dense allreduce,
  // which also sums the checkpoint and stop flags (agreed_*_).
  absl::Status PushAndAllreduce(int64_t step, StepTimes* times, LookupBuffers* buf);
  // The dense gradients and `flags` copied into reduce_buf_: the span to
  // allreduce. UnstageAllreduce copies the reduced gradients back and the
  // summed flags into `flags`.
  absl::StatusOr<absl::Span<float>> StageAllreduce(const float flags[2]);
  absl::Status UnstageAllreduce(absl::Span<const float> reduce, float flags[2]);

  // Run's lookup of the step after the current one, read while the
  // current one computes.
  struct Prefetch {
    bool more = false;  // the next batch was read
    std::thread thread;  // its lookup, when it runs beside the step
    absl::Status status;
    StepTimes times;
    // Sync prefetch: the rows were read as a lookup of the current step;
    // CorrectAndPool re-reads what it updated (`epoch`: the shard map's).
    bool sync = false;
    uint64_t epoch = 0;
  };
  // Run's steps. Evaluate, recorded in `result`.
  absl::Status EvaluateInto(int64_t step, TrainResult* result);
  // The next training batch; false at the end of the data.
  absl::StatusOr<bool> ReadBatch(Batch* batch, TrainResult* result);
  // Reads the batch after step `step` and starts its lookup beside the
  // step where the consistency mode allows it.
  absl::Status StartPrefetch(int64_t step, Batch* next_batch,
                             LookupBuffers* next_buf, Prefetch* prefetch,
                             TrainResult* result);
  // The checkpoint cut after `step` steps (the agreement is in agreed_*_).
  absl::Status TakeCheckpoint(int64_t step, const std::string& reason,
                              bool wait_complete, TrainResult* result);
  // At the step boundary after `boundary` steps: cuts when the workers
  // agreed to, or periodically, or at the end (`more` false). Returns
  // whether training stops there (pre-empted).
  absl::StatusOr<bool> CheckpointAtBoundary(int64_t boundary, bool more,
                                            const Batch& next_batch,
                                            LookupBuffers* next_buf,
                                            TrainResult* result);
  // Whether the consistency mode lets lookups run a step ahead.
  bool OverlapLookups() const;
  // Sync mode with options_.sync_prefetch.
  bool SyncPrefetch() const;
  // The local reasons to cut, read just before the step's allreduce.
  void ReadLocalFlags(float* checkpoint, float* stop);

  v1::JobConfig job_;
  TrainerOptions options_;
  std::unique_ptr<client::EmbeddingClient> client_;
  std::unique_ptr<BatchSource> train_;
  std::function<absl::StatusOr<std::unique_ptr<BatchSource>>()> make_eval_source_;
  std::unique_ptr<DlrmModel> model_;
  std::unique_ptr<DenseOptimizer> optimizer_;
  int dim_ = 0;

  LookupBuffers buffers_[2];
  LookupBuffers eval_buffers_;
  std::vector<float> grad_pooled_;
  std::vector<bool> grad_written_;  // per table: gradient rows written
  std::vector<float> logits_, probabilities_, grad_logits_;

  // Dense gradients plus the two agreement flags ("checkpoint", "stop")
  // that ride on the allreduce.
  kernels::DeviceBuffer reduce_buf_;
  std::vector<TableGroup> groups_;          // pool_on_device
  std::vector<DeviceTable> device_tables_;  // one per group
  // options_.ctx on the CPU: pooling, loss, embedding gradients.
  kernels::ExecContext host_ctx_;
  // The agreed flags of the last step (summed over workers).
  bool agreed_checkpoint_ = false;
  bool agreed_stop_ = false;
  uint64_t handled_request_id_ = 0;
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_TRAINER_H_

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
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/dedup.h"
#include "client/embedding_client.h"
#include "kernels/embedding_bag.h"
#include "kernels/exec_context.h"
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
// did not hide. `eval` is the evaluations run during training.
struct StepTimes {
  double data = 0, lookup = 0, forward = 0, backward = 0, push = 0,
         allreduce = 0, optimizer = 0, lookup_wait = 0, eval = 0;
  double total() const {
    return data + lookup + forward + backward + push + allreduce + optimizer;
  }
};

struct EvalRecord {
  int64_t step = 0;  // steps trained before this evaluation
  EvalMetrics metrics;
};

struct TrainResult {
  int64_t steps = 0;
  int64_t samples = 0;  // this worker's
  double seconds = 0;
  double last_loss = 0;
  std::vector<float> losses;  // this worker's mean loss of every step
  StepTimes times;
  std::vector<EvalRecord> evals;
};

struct TrainerOptions {
  int rank = 0;
  int world_size = 1;
  kernels::ExecContext ctx;
  // Data-parallel hook over the dense gradients, called every step before the
  // optimizer; it must leave the global-batch gradient (the sum over workers,
  // each already scaled by 1 / world_size). Null: one worker, identity.
  std::function<absl::Status(absl::Span<float>)> allreduce;
  // Called after every step and evaluation (progress display, metrics).
  std::function<void(int64_t step, float loss, const TrainResult&)> on_step;
  std::function<void(const EvalRecord&)> on_eval;
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
    std::vector<float> pooled;       // B x F x D, sample-major
    std::vector<float> feature_buf;  // B x D scratch
  };

  // Looks up and pools `batch`'s embeddings into buf->pooled.
  absl::Status LookupAndPool(const Batch& batch, int64_t step, StepTimes* times,
                             LookupBuffers* buf);
  // Forward, backward, push and optimizer for a looked-up batch.
  absl::StatusOr<float> Compute(const Batch& batch, int64_t step,
                                StepTimes* times, LookupBuffers* buf);
  // Whether the consistency mode lets lookups run a step ahead.
  bool OverlapLookups() const;

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
  std::vector<float> grad_pooled_, feature_grad_, backward_buf_;
  std::vector<float> logits_, probabilities_, grad_logits_;
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_TRAINER_H_

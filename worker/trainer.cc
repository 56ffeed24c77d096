#include "worker/trainer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/device_memory.h"
#include "kernels/dispatch.h"
#include "kernels/loss.h"
#include "common/config/table_config.h"
#include "common/config/job_config.h"
#include "worker/model/dense_state.h"

namespace recps::worker {
namespace {

// Seconds since `start`, added to `*into`.
void Charge(absl::Time start, double* into) {
  *into += absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const v1::JobConfig& job, std::unique_ptr<client::EmbeddingClient> client,
    std::unique_ptr<BatchSource> train,
    std::function<absl::StatusOr<std::unique_ptr<BatchSource>>()> make_eval_source,
    TrainerOptions options) {
  RETURN_IF_ERROR(config::ValidateJobConfig(job));
  if (client == nullptr || train == nullptr) {
    return absl::InvalidArgumentError("Trainer needs a client and a train source");
  }
  std::unique_ptr<Trainer> t(new Trainer());
  t->job_ = job;
  t->options_ = std::move(options);
  // Pooling, its backward and the loss run on the host (the looked-up rows
  // and the labels arrive there); the dense model runs on options.ctx.
  t->host_ctx_ = t->options_.ctx;
  t->host_ctx_.device = kernels::Device::kCpu;
  t->host_ctx_.cuda_stream = nullptr;
  t->host_ctx_.cublas_handle = nullptr;
  t->reduce_buf_ =
      kernels::DeviceBuffer(t->options_.ctx.device, t->options_.ctx.cuda_device);
  t->client_ = std::move(client);
  t->train_ = std::move(train);
  t->make_eval_source_ = std::move(make_eval_source);
  t->dim_ = config::EmbeddingDim(job);

  std::vector<FeatureState> features;
  for (const v1::FeatureConfig& f : job.features()) {
    FeatureState fs;
    fs.table = t->client_->FindTable(f.table());
    if (fs.table < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature '", f.name(), "': the client has no table '", f.table(), "'"));
    }
    fs.pooling = f.pooling() == v1::FeatureConfig::MEAN ? kernels::PoolingMode::kMean
                                                        : kernels::PoolingMode::kSum;
    features.push_back(std::move(fs));
  }
  for (LookupBuffers* buf : {&t->buffers_[0], &t->buffers_[1], &t->eval_buffers_}) {
    buf->tables.resize(t->client_->tables().size());
    buf->features = features;
  }
  if (t->options_.pool_on_device) {
    // One group per table, its features in order; one pooling mode each.
    std::vector<int> group_of(t->client_->tables().size(), -1);
    for (int f = 0; f < static_cast<int>(features.size()); ++f) {
      const int table = features[f].table;
      if (group_of[table] < 0) {
        group_of[table] = static_cast<int>(t->groups_.size());
        t->groups_.push_back({table, features[f].pooling, {}});
      }
      TableGroup& g = t->groups_[group_of[table]];
      if (g.pooling != features[f].pooling) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pool_on_device: features '", job.features(g.features[0]).name(), "' and '",
            job.features(f).name(), "' share table '", job.features(f).table(),
            "' with different pooling; give them one pooling or pool on the host"));
      }
      g.features.push_back(f);
    }
    for (size_t g = 0; g < t->groups_.size(); ++g) {
      const kernels::Device d = t->options_.ctx.device;
      const int ordinal = t->options_.ctx.cuda_device;
      DeviceTable dt;
      dt.rows = kernels::DeviceBuffer(d, ordinal);
      dt.grad_rows = kernels::DeviceBuffer(d, ordinal);
      dt.bags = kernels::DeviceBuffer(d, ordinal);
      dt.indices = kernels::DeviceArray<int64_t>(d, ordinal);
      dt.offsets = kernels::DeviceArray<int64_t>(d, ordinal);
      t->device_tables_.push_back(std::move(dt));
    }
    for (LookupBuffers* buf : {&t->buffers_[0], &t->buffers_[1], &t->eval_buffers_}) {
      buf->group_indices.resize(t->groups_.size());
      buf->group_offsets.resize(t->groups_.size());
    }
  }

  DlrmConfig model;
  model.num_sparse = job.features_size();
  model.embedding_dim = t->dim_;
  model.bottom_mlp.assign(job.model().bottom_mlp().begin(), job.model().bottom_mlp().end());
  model.top_mlp.assign(job.model().top_mlp().begin(), job.model().top_mlp().end());
  model.seed = job.training().seed();
  model.num_dense = job.data().has_synthetic() ? job.data().synthetic().num_dense() : 13;
  ASSIGN_OR_RETURN(t->model_, DlrmModel::Create(model, t->options_.ctx));
  ASSIGN_OR_RETURN(const OptimizerParams dense_optimizer,
                   config::OptimizerParamsFromConfig(job.training().dense_optimizer()));
  ASSIGN_OR_RETURN(t->optimizer_,
                   DenseOptimizer::Create(dense_optimizer, t->model_->num_parameters(),
                                          t->options_.ctx));
  // Gradients plus the two agreement flags, on the model's device.
  RETURN_IF_ERROR(t->reduce_buf_.Resize(
      static_cast<size_t>(t->model_->num_parameters()) + 2));
  return t;
}

absl::Status Trainer::LookupAndPool(const Batch& batch, int64_t step,
                                    StepTimes* times, LookupBuffers* buf) {
  RETURN_IF_ERROR(DedupAndLookup(batch, step, times, buf));
  return Pool(batch, times, buf);
}

absl::Status Trainer::CorrectAndPool(const Batch& batch, int64_t step,
                                     uint64_t prefetch_epoch, StepTimes* times,
                                     LookupBuffers* buf) {
  const absl::Time start = absl::Now();
  client::LookupInfo info;
  RETURN_IF_ERROR(client_->LookupUpdated(step, buf->specs, &info));
  // Rows that moved to another server since the prefetch are not covered
  // by its answer: read everything again (rare: a map change).
  if (client_->shard_map_epoch() != prefetch_epoch) {
    RETURN_IF_ERROR(client_->Lookup(step, buf->specs, &info));
  }
  buf->staleness = info.staleness_steps;
  Charge(start, &times->lookup);
  return Pool(batch, times, buf);
}

absl::Status Trainer::DedupAndLookup(const Batch& batch, int64_t step,
                                     StepTimes* times, LookupBuffers* buf) {
  std::vector<TableState>& tables_ = buf->tables;
  std::vector<FeatureState>& features_ = buf->features;
  const int num_features = static_cast<int>(features_.size());
  if (batch.num_sparse() != num_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch has ", batch.num_sparse(), " sparse features; the job has ",
        num_features));
  }
  // Dedup per table over every feature that uses it; each feature keeps
  // indices into its table's unique rows.
  std::vector<bool> seen(tables_.size(), false);
  for (int f = 0; f < num_features; ++f) {
    FeatureState& fs = features_[f];
    TableState& ts = tables_[fs.table];
    const size_t before = seen[fs.table] ? ts.dedup.inverse.size() : 0;
    if (seen[fs.table]) {
      client::DeduplicateAppend(batch.ids[f], &ts.dedup);
    } else {
      client::Deduplicate(batch.ids[f], &ts.dedup);
      seen[fs.table] = true;
    }
    fs.indices.assign(ts.dedup.inverse.begin() + before, ts.dedup.inverse.end());
  }
  // One Lookup for every table: the client fans out to the shard servers.
  std::vector<client::LookupSpec>& specs = buf->specs;
  specs.clear();
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (!seen[t]) continue;
    TableState& ts = tables_[t];
    ts.rows.resize(ts.dedup.unique.size() * dim_);
    // Distinct already: the client routes them without hashing again.
    specs.push_back({static_cast<int>(t), ts.dedup.unique, ts.rows.data(),
                     /*distinct=*/true});
  }
  absl::Time start = absl::Now();
  client::LookupInfo info;
  RETURN_IF_ERROR(client_->Lookup(step, specs, &info));
  buf->staleness = info.staleness_steps;
  Charge(start, &times->lookup);
  return absl::OkStatus();
}

absl::Status Trainer::Pool(const Batch& batch, StepTimes* times,
                           LookupBuffers* buf) {
  const std::vector<TableState>& tables_ = buf->tables;
  const std::vector<FeatureState>& features_ = buf->features;
  std::vector<float>& pooled_ = buf->pooled;
  const int num_features = static_cast<int>(features_.size());
  const absl::Time start = absl::Now();
  const int64_t b = batch.size;
  if (options_.pool_on_device) {
    // Host half only (this may be the helper thread): the kernels run in
    // DeviceForward, on the training thread's stream.
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<int64_t>& indices = buf->group_indices[g];
      std::vector<int64_t>& offsets = buf->group_offsets[g];
      indices.clear();
      offsets.clear();
      for (int f : groups_[g].features) {
        const int64_t base = static_cast<int64_t>(indices.size());
        const std::vector<int64_t>& off = batch.offsets[f];
        for (int64_t i = 0; i < b; ++i) offsets.push_back(base + off[i] - off[0]);
        indices.insert(indices.end(), features_[f].indices.begin(),
                       features_[f].indices.end());
      }
      offsets.push_back(static_cast<int64_t>(indices.size()));
    }
    Charge(start, &times->forward);
    return absl::OkStatus();
  }
  pooled_.resize(b * num_features * dim_);
  // Each feature pools straight from its table's unique rows into its
  // column block of the sample-major B x F x D tensor (output_stride), so
  // no per-feature buffer and no interleaving copy.
  for (int f = 0; f < num_features; ++f) {
    const FeatureState& fs = features_[f];
    const TableState& ts = tables_[fs.table];
    kernels::EmbeddingBagForwardArgs a;
    a.rows = ts.rows.data();
    a.num_rows = static_cast<int64_t>(ts.dedup.unique.size());
    a.row_stride = dim_;
    a.dim = dim_;
    a.indices = fs.indices.data();
    a.num_indices = static_cast<int64_t>(fs.indices.size());
    a.offsets = batch.offsets[f].data();
    a.num_bags = b;
    a.pooling = fs.pooling;
    a.output = pooled_.data() + static_cast<int64_t>(f) * dim_;
    a.output_stride = static_cast<int64_t>(num_features) * dim_;
    RETURN_IF_ERROR(kernels::EmbeddingBagForward(a, host_ctx_));
  }
  Charge(start, &times->forward);
  return absl::OkStatus();
}

absl::StatusOr<float> Trainer::TrainStep(const Batch& batch, int64_t step,
                                         StepTimes* times) {
  RETURN_IF_ERROR(LookupAndPool(batch, step, times, &buffers_[0]));
  return Compute(batch, step, times, &buffers_[0]);
}

void Trainer::ReadLocalFlags(float* checkpoint, float* stop) {
  *checkpoint = 0;
  *stop = 0;
  if (!options_.checkpoint) return;
  if (options_.checkpoint_request_id &&
      options_.checkpoint_request_id() > handled_request_id_) {
    *checkpoint = 1;
  }
  if (options_.stop_requested && options_.stop_requested()) *stop = 1;
}

bool Trainer::SyncPrefetch() const {
  const v1::ConsistencyConfig::Mode mode = job_.training().consistency().mode();
  return options_.sync_prefetch && (mode == v1::ConsistencyConfig::SYNC ||
                                    mode == v1::ConsistencyConfig::MODE_UNSPECIFIED);
}

bool Trainer::OverlapLookups() const {
  return job_.training().consistency().mode() == v1::ConsistencyConfig::BOUNDED ||
         job_.training().consistency().mode() == v1::ConsistencyConfig::ASYNC;
}

absl::StatusOr<float> Trainer::Compute(const Batch& batch, int64_t step,
                                       StepTimes* times, LookupBuffers* buf) {
  ASSIGN_OR_RETURN(const float loss, ForwardLoss(batch, times, buf));
  RETURN_IF_ERROR(Backward(batch, times, buf));
  RETURN_IF_ERROR(PushAndAllreduce(step, times, buf));
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(optimizer_->Step(model_->parameters(), model_->gradients(),
                                   options_.ctx));
  Charge(start, &times->optimizer);
  return loss;
}

absl::StatusOr<float> Trainer::ForwardLoss(const Batch& batch, StepTimes* times,
                                           LookupBuffers* buf) {
  const int64_t b = batch.size;
  const absl::Time start = absl::Now();
  logits_.resize(b);
  grad_logits_.resize(b);
  if (options_.pool_on_device) {
    RETURN_IF_ERROR(DeviceForward(batch, buf));
  } else {
    RETURN_IF_ERROR(model_->Forward(b, batch.dense.data(), buf->pooled.data(),
                                    logits_.data(), options_.ctx));
  }
  float loss = 0;
  kernels::SigmoidBceArgs bce;
  bce.n = b;
  bce.logits = logits_.data();
  bce.labels = batch.labels.data();
  bce.loss = &loss;
  bce.grad_logits = grad_logits_.data();
  RETURN_IF_ERROR(kernels::SigmoidBce(bce, host_ctx_));
  Charge(start, &times->forward);
  return loss;
}

absl::Status Trainer::Backward(const Batch& batch, StepTimes* times,
                               LookupBuffers* buf) {
  // Each worker's loss is the mean over its batch; scaling by 1/W makes the
  // sum over workers (shard servers add pushes, the allreduce adds dense
  // gradients) the gradient of the mean over the global batch.
  const absl::Time start = absl::Now();
  const float scale = 1.0f / options_.world_size;
  if (options_.world_size > 1) {
    for (float& g : grad_logits_) g *= scale;
  }
  if (options_.pool_on_device) {
    RETURN_IF_ERROR(DeviceBackward(batch, buf));
  } else {
    RETURN_IF_ERROR(HostBackward(batch, buf));
  }
  Charge(start, &times->backward);
  return absl::OkStatus();
}

absl::Status Trainer::HostBackward(const Batch& batch, LookupBuffers* buf) {
  std::vector<TableState>& tables_ = buf->tables;
  const std::vector<FeatureState>& features_ = buf->features;
  const int64_t b = batch.size;
  const int num_features = static_cast<int>(features_.size());
  grad_pooled_.resize(buf->pooled.size());
  RETURN_IF_ERROR(model_->Backward(grad_logits_.data(), grad_pooled_.data(),
                                   options_.ctx));
  // Each feature's pooled gradient is read in place from its column block
  // of grad_pooled (grad_output_stride) and summed straight into its
  // table's per-unique-id gradient rows: the first feature of a table
  // writes every row (no zeroing pass), later ones sharing the table add
  // their sums in feature order (deterministic, as before).
  std::vector<bool>& written = grad_written_;
  written.assign(tables_.size(), false);
  for (int f = 0; f < num_features; ++f) {
    const FeatureState& fs = features_[f];
    TableState& ts = tables_[fs.table];
    const int64_t num_rows = static_cast<int64_t>(ts.dedup.unique.size());
    if (!written[fs.table]) ts.grad_rows.resize(num_rows * dim_);
    kernels::EmbeddingBagBackwardArgs a;
    a.grad_output = grad_pooled_.data() + static_cast<int64_t>(f) * dim_;
    a.grad_output_stride = static_cast<int64_t>(num_features) * dim_;
    a.dim = dim_;
    a.indices = fs.indices.data();
    a.num_indices = static_cast<int64_t>(fs.indices.size());
    a.offsets = batch.offsets[f].data();
    a.num_bags = b;
    a.pooling = fs.pooling;
    a.num_rows = num_rows;
    a.grad_rows = ts.grad_rows.data();
    a.accumulate = written[fs.table];
    RETURN_IF_ERROR(kernels::EmbeddingBagBackward(a, host_ctx_));
    written[fs.table] = true;
  }
  return absl::OkStatus();
}

absl::Status Trainer::PushAndAllreduce(int64_t step, StepTimes* times,
                                       LookupBuffers* buf) {
  // The dense allreduce and the push depend on neither each other nor
  // anything the other changes. On the host the allreduce runs on a helper
  // thread while the push goes out and waits for the other ranks' pushes,
  // so the two collectives' waits overlap (W2 S-p20: the allreduce phase
  // was 13 of 137 ms). `allreduce` then times only what is left to wait
  // for after the push. With NCCL it stays after the push, on this thread
  // (its device and stream are this thread's).
  absl::Time start = absl::Now();
  float flags[2] = {0, 0};  // checkpoint, stop
  ReadLocalFlags(&flags[0], &flags[1]);
  absl::Span<float> reduce;
  if (options_.allreduce) {
    ASSIGN_OR_RETURN(reduce, StageAllreduce(flags));
  }
  absl::Status reduced = absl::OkStatus();
  std::thread overlapped;
  if (options_.allreduce && options_.ctx.device == kernels::Device::kCpu) {
    overlapped = std::thread([&] { reduced = options_.allreduce(reduce); });
  }
  Charge(start, &times->allreduce);

  start = absl::Now();
  std::vector<client::PushSpec> pushes;
  for (size_t t = 0; t < buf->tables.size(); ++t) {
    const TableState& ts = buf->tables[t];
    if (ts.dedup.unique.empty()) continue;
    pushes.push_back({static_cast<int>(t), ts.dedup.unique, ts.grad_rows.data(),
                      /*distinct=*/true});
  }
  const absl::Status pushed = client_->PushGradients(step, pushes);
  Charge(start, &times->push);

  start = absl::Now();
  if (overlapped.joinable()) {
    overlapped.join();  // before any return: it writes `reduced` and `reduce`
  } else if (options_.allreduce && pushed.ok()) {
    reduced = options_.allreduce(reduce);
  }
  RETURN_IF_ERROR(pushed);
  RETURN_IF_ERROR(reduced);
  if (options_.allreduce) RETURN_IF_ERROR(UnstageAllreduce(reduce, flags));
  agreed_checkpoint_ = flags[0] > 0.5f;
  agreed_stop_ = flags[1] > 0.5f;
  Charge(start, &times->allreduce);
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<float>> Trainer::StageAllreduce(const float flags[2]) {
  // The checkpoint decision rides on the dense allreduce (two floats after
  // the gradients), so every worker agrees on the cut with no extra round
  // trip. Always appended, checkpoints or not: the reduced buffer, and so
  // the gradients' summation, is the same either way. The buffer is on the
  // model's device (NCCL reduces GPU memory in place).
  const kernels::ExecContext& ctx = options_.ctx;
  const absl::Span<float> grads = model_->gradients();
  const size_t num_grads = grads.size();
  const absl::Span<float> reduce = absl::MakeSpan(reduce_buf_.data(), num_grads + 2);
  RETURN_IF_ERROR(kernels::CopyOnDevice(reduce.data(), grads.data(), num_grads, ctx));
  RETURN_IF_ERROR(kernels::CopyToDevice(reduce.data() + num_grads, flags, 2, ctx));
  // The collective runs on its own stream: the copies must be complete.
  RETURN_IF_ERROR(kernels::Synchronize(ctx));
  return reduce;
}

absl::Status Trainer::UnstageAllreduce(absl::Span<const float> reduce, float flags[2]) {
  const kernels::ExecContext& ctx = options_.ctx;
  const size_t num_grads = reduce.size() - 2;
  RETURN_IF_ERROR(kernels::CopyOnDevice(model_->gradients().data(), reduce.data(),
                                        num_grads, ctx));
  RETURN_IF_ERROR(kernels::CopyToHost(flags, reduce.data() + num_grads, 2, ctx));
  return kernels::Synchronize(ctx);
}

absl::Status Trainer::DeviceForward(const Batch& batch, LookupBuffers* buf) {
  const kernels::ExecContext& ctx = options_.ctx;
  const int64_t b = batch.size;
  const int64_t num_features = static_cast<int64_t>(buf->features.size());
  ASSIGN_OR_RETURN(float* pooled, model_->PooledInput(b));
  for (size_t g = 0; g < groups_.size(); ++g) {
    const TableGroup& group = groups_[g];
    const TableState& ts = buf->tables[group.table];
    DeviceTable& dt = device_tables_[g];
    const std::vector<int64_t>& indices = buf->group_indices[g];
    const std::vector<int64_t>& offsets = buf->group_offsets[g];
    const int64_t num_rows = static_cast<int64_t>(ts.dedup.unique.size());
    const int64_t num_bags = b * static_cast<int64_t>(group.features.size());
    // Each distinct row crosses once, however many bags use it.
    RETURN_IF_ERROR(dt.rows.Resize(static_cast<size_t>(num_rows * dim_)));
    RETURN_IF_ERROR(dt.indices.Resize(indices.size()));
    RETURN_IF_ERROR(dt.offsets.Resize(offsets.size()));
    RETURN_IF_ERROR(dt.bags.Resize(static_cast<size_t>(num_bags * dim_)));
    RETURN_IF_ERROR(kernels::CopyToDevice(dt.rows.data(), ts.rows.data(),
                                          static_cast<size_t>(num_rows * dim_), ctx));
    RETURN_IF_ERROR(kernels::CopyToDevice(dt.indices.data(), indices.data(),
                                          indices.size(), ctx));
    RETURN_IF_ERROR(kernels::CopyToDevice(dt.offsets.data(), offsets.data(),
                                          offsets.size(), ctx));
    kernels::EmbeddingBagForwardArgs a;
    a.rows = dt.rows.data();
    a.num_rows = num_rows;
    a.row_stride = dim_;
    a.dim = dim_;
    a.indices = dt.indices.data();
    a.num_indices = static_cast<int64_t>(indices.size());
    a.offsets = dt.offsets.data();
    a.num_bags = num_bags;
    a.pooling = group.pooling;
    a.output = dt.bags.data();
    RETURN_IF_ERROR(kernels::EmbeddingBagForward(a, ctx));
    // Feature j's B bags into its column block of the B x F x D input.
    for (size_t j = 0; j < group.features.size(); ++j) {
      RETURN_IF_ERROR(kernels::CopyStridedOnDevice(
          pooled + static_cast<int64_t>(group.features[j]) * dim_,
          static_cast<size_t>(num_features * dim_),
          dt.bags.data() + static_cast<int64_t>(j) * b * dim_, dim_, dim_,
          static_cast<size_t>(b), ctx));
    }
  }
  // Synchronizes: the host buffers above may be reused afterwards.
  return model_->ForwardPooledInPlace(b, batch.dense.data(), logits_.data(), ctx);
}

absl::Status Trainer::DeviceBackward(const Batch& batch, LookupBuffers* buf) {
  const kernels::ExecContext& ctx = options_.ctx;
  const int64_t b = batch.size;
  const int64_t num_features = static_cast<int64_t>(buf->features.size());
  ASSIGN_OR_RETURN(const float* grad_pooled,
                   model_->BackwardToDevice(grad_logits_.data(), ctx));
  for (size_t g = 0; g < groups_.size(); ++g) {
    const TableGroup& group = groups_[g];
    TableState& ts = buf->tables[group.table];
    DeviceTable& dt = device_tables_[g];
    const int64_t num_rows = static_cast<int64_t>(ts.dedup.unique.size());
    const int64_t num_bags = b * static_cast<int64_t>(group.features.size());
    // The bags' gradients, feature after feature (as the forward's output).
    for (size_t j = 0; j < group.features.size(); ++j) {
      RETURN_IF_ERROR(kernels::CopyStridedOnDevice(
          dt.bags.data() + static_cast<int64_t>(j) * b * dim_, dim_,
          grad_pooled + static_cast<int64_t>(group.features[j]) * dim_,
          static_cast<size_t>(num_features * dim_), dim_, static_cast<size_t>(b),
          ctx));
    }
    RETURN_IF_ERROR(dt.grad_rows.Resize(static_cast<size_t>(num_rows * dim_)));
    kernels::EmbeddingBagBackwardArgs a;
    a.grad_output = dt.bags.data();
    a.dim = dim_;
    a.indices = dt.indices.data();
    a.num_indices = static_cast<int64_t>(buf->group_indices[g].size());
    a.offsets = dt.offsets.data();
    a.num_bags = num_bags;
    a.pooling = group.pooling;
    a.num_rows = num_rows;
    a.grad_rows = dt.grad_rows.data();
    RETURN_IF_ERROR(kernels::EmbeddingBagBackward(a, ctx));
    ts.grad_rows.resize(static_cast<size_t>(num_rows * dim_));
    RETURN_IF_ERROR(kernels::CopyToHost(ts.grad_rows.data(), dt.grad_rows.data(),
                                        static_cast<size_t>(num_rows * dim_), ctx));
  }
  return kernels::Synchronize(ctx);
}

absl::StatusOr<EvalMetrics> Trainer::Evaluate(int64_t step) {
  if (!make_eval_source_) return absl::FailedPreconditionError("no eval data");
  ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, make_eval_source_());
  std::vector<float> probabilities, labels;
  StepTimes ignored;
  Batch batch;
  for (int64_t i = 0; i < job_.training().eval_batches(); ++i) {
    ASSIGN_OR_RETURN(const bool more, source->Next(&batch));
    if (!more) break;
    RETURN_IF_ERROR(LookupAndPool(batch, step, &ignored, &eval_buffers_));
    logits_.resize(batch.size);
    if (options_.pool_on_device) {
      RETURN_IF_ERROR(DeviceForward(batch, &eval_buffers_));
    } else {
      RETURN_IF_ERROR(model_->Forward(batch.size, batch.dense.data(),
                                      eval_buffers_.pooled.data(),
                                      logits_.data(), options_.ctx));
    }
    probabilities_.resize(batch.size);
    kernels::SigmoidBceArgs bce;
    bce.n = batch.size;
    bce.logits = logits_.data();
    bce.labels = batch.labels.data();
    bce.probabilities = probabilities_.data();
    RETURN_IF_ERROR(kernels::SigmoidBce(bce, host_ctx_));
    probabilities.insert(probabilities.end(), probabilities_.begin(), probabilities_.end());
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  }
  if (probabilities.empty()) return absl::FailedPreconditionError("eval data is empty");
  return ComputeEvalMetrics(probabilities, labels);
}

absl::Status Trainer::EvaluateInto(int64_t step, TrainResult* result) {
  const absl::Time start = absl::Now();
  absl::StatusOr<EvalMetrics> evaluated = Evaluate(step);
  Charge(start, &result->times.eval);
  ASSIGN_OR_RETURN(EvalMetrics m, std::move(evaluated));
  result->evals.push_back({step, m});
  if (options_.on_eval) options_.on_eval(result->evals.back());
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::ReadBatch(Batch* batch, TrainResult* result) {
  const absl::Time start = absl::Now();
  absl::StatusOr<bool> more = train_->Next(batch);
  Charge(start, &result->times.data);
  return more;
}

absl::Status Trainer::TakeCheckpoint(int64_t step, const std::string& reason,
                                     bool wait_complete, TrainResult* result) {
  const absl::Time start = absl::Now();
  CheckpointCutInfo info;
  info.step = step;
  info.reason = reason;
  info.wait_complete = wait_complete;
  info.batches_read = step;
  if (options_.rank == 0) {
    ASSIGN_OR_RETURN(info.dense, SaveDenseState(*model_, *optimizer_));
  }
  if (options_.checkpoint_request_id) {
    handled_request_id_ = std::max(handled_request_id_, options_.checkpoint_request_id());
  }
  RETURN_IF_ERROR(options_.checkpoint(info));
  result->checkpoint_steps.push_back(step);
  result->checkpoint_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status Trainer::StartPrefetch(int64_t step, Batch* next_batch,
                                    LookupBuffers* next_buf, Prefetch* prefetch,
                                    TrainResult* result) {
  ASSIGN_OR_RETURN(prefetch->more, ReadBatch(next_batch, result));
  if (prefetch->more && OverlapLookups()) {
    // The server holds this lookup until step+1 is inside its staleness
    // window; meanwhile this thread computes step `step`.
    prefetch->thread = std::thread([this, step, next_batch, next_buf, prefetch] {
      prefetch->status = LookupAndPool(*next_batch, step + 1, &prefetch->times, next_buf);
    });
  } else if (prefetch->more && SyncPrefetch()) {
    // Read as a lookup of step `step` (the server answers once step-1
    // is applied, i.e. at once): every row is then as after step-1 or
    // as after `step`, and CorrectAndPool re-reads exactly the rows
    // `step` updates, so step+1 sees what a plain lookup would.
    prefetch->sync = true;
    prefetch->epoch = client_->shard_map_epoch();
    prefetch->thread = std::thread([this, step, next_batch, next_buf, prefetch] {
      prefetch->status = DedupAndLookup(*next_batch, step, &prefetch->times, next_buf);
    });
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::CheckpointAtBoundary(int64_t boundary, bool more,
                                                   const Batch& next_batch,
                                                   LookupBuffers* next_buf,
                                                   TrainResult* result) {
  if (!options_.checkpoint) return false;
  const bool last = !more;
  const bool stop = agreed_stop_;
  std::string reason;
  if (stop) {
    reason = "preempted";
  } else if (last) {
    reason = "final";
  } else if (agreed_checkpoint_) {
    reason = "requested";
  } else if (options_.checkpoint_every > 0 && boundary % options_.checkpoint_every == 0) {
    reason = "periodic";
  }
  if (reason.empty()) return stop;
  RETURN_IF_ERROR(TakeCheckpoint(boundary, reason, stop || last, result));
  if (more && OverlapLookups() && !stop) {
    // Bounded and async: step+1's lookup ran during step `step`, before
    // the cut. Redo it, so the step after a checkpoint reads the rows
    // as saved, as a run resumed from it does.
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(LookupAndPool(next_batch, boundary, &result->times, next_buf));
    result->checkpoint_seconds.back() += absl::ToDoubleSeconds(absl::Now() - start);
  }
  return stop;
}

absl::StatusOr<TrainResult> Trainer::Run() {
  TrainResult result;
  const v1::TrainingConfig& training = job_.training();
  const int64_t start_step = options_.start_step;
  if (start_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("start step ", start_step, " is negative"));
  }
  result.steps = start_step;
  const absl::Time run_start = absl::Now();
  // Requests made before this run started are not this run's to answer.
  if (options_.checkpoint && options_.checkpoint_request_id) {
    handled_request_id_ = options_.checkpoint_request_id();
  }
  // A first evaluation of the untrained model: the baseline to beat (a
  // resumed run had it before its checkpoint).
  if (start_step == 0) RETURN_IF_ERROR(EvaluateInto(0, &result));
  // Batch and lookup buffers of the current step and, when lookups overlap
  // compute, of the next one (looked up on a helper thread meanwhile).
  Batch batches[2];
  int cur = 0;
  bool more = false;
  if (start_step < training.steps()) {
    ASSIGN_OR_RETURN(more, ReadBatch(&batches[cur], &result));
  }
  if (more) {
    RETURN_IF_ERROR(LookupAndPool(batches[cur], start_step, &result.times, &buffers_[cur]));
  }
  for (int64_t step = start_step; more && step < training.steps(); ++step) {
    const absl::Time step_start = absl::Now();
    double step_eval = 0;
    const int next = 1 - cur;
    Prefetch prefetch;
    if (step + 1 < training.steps()) {
      RETURN_IF_ERROR(StartPrefetch(step, &batches[next], &buffers_[next], &prefetch, &result));
    }
    absl::StatusOr<float> loss = Compute(batches[cur], step, &result.times, &buffers_[cur]);
    if (prefetch.thread.joinable()) {
      const absl::Time start = absl::Now();
      prefetch.thread.join();
      Charge(start, &result.times.lookup_wait);
    }
    RETURN_IF_ERROR(loss.status());
    RETURN_IF_ERROR(prefetch.status);
    // The sync prefetch ran beside the step: its own phase, so `lookup`
    // stays what the training thread spent looking up (the correction).
    (prefetch.sync ? result.times.prefetch : result.times.lookup) += prefetch.times.lookup;
    result.times.forward += prefetch.times.forward;
    result.steps = step + 1;
    result.samples += batches[cur].size;
    result.last_loss = *loss;
    result.losses.push_back(*loss);
    result.last_lookup_staleness = buffers_[cur].staleness;
    result.max_lookup_staleness =
        std::max(result.max_lookup_staleness, result.last_lookup_staleness);
    more = prefetch.more;
    // Reported before a checkpoint cut at step+1: a worker killed once the cut
    // is saved resumes after this step, so it must not still owe its loss.
    result.seconds = absl::ToDoubleSeconds(absl::Now() - run_start);
    if (options_.on_step) options_.on_step(step, *loss, result);

    // The step boundary after step + 1 steps: every worker decides the same
    // (the flags were summed by this step's allreduce, the rest is a
    // function of the step and the shared data length).
    ASSIGN_OR_RETURN(const bool stop, CheckpointAtBoundary(step + 1, more, batches[next],
                                                           &buffers_[next], &result));
    if (stop) {
      result.preempted = true;
      result.step_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - step_start));
      result.step_samples.push_back(static_cast<int32_t>(batches[cur].size));
      break;
    }
    if (training.eval_interval() > 0 && (step + 1) % training.eval_interval() == 0 &&
        step + 1 < training.steps()) {
      const absl::Time start = absl::Now();
      RETURN_IF_ERROR(EvaluateInto(step + 1, &result));
      step_eval = absl::ToDoubleSeconds(absl::Now() - start);
    }
    if (more && prefetch.sync) {
      RETURN_IF_ERROR(CorrectAndPool(batches[next], step + 1, prefetch.epoch,
                                     &result.times, &buffers_[next]));
    } else if (more && !OverlapLookups()) {
      RETURN_IF_ERROR(LookupAndPool(batches[next], step + 1, &result.times, &buffers_[next]));
    }
    result.step_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - step_start) - step_eval);
    result.step_samples.push_back(static_cast<int32_t>(batches[cur].size));
    cur = next;
  }
  if (!result.preempted && result.steps > start_step) RETURN_IF_ERROR(EvaluateInto(result.steps, &result));
  result.seconds = absl::ToDoubleSeconds(absl::Now() - run_start);
  return result;
}

}  // namespace recps::worker

// The job config (recps.v1.JobConfig): reading it and checking it as a whole
// before anything starts, with errors that name the field; and the memory a
// worker needs for it, estimated from the config alone.
#ifndef RECPS_COMMON_CONFIG_JOB_CONFIG_H_
#define RECPS_COMMON_CONFIG_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "recps/v1/job.pb.h"
#include "recps/v1/shard.pb.h"

namespace recps::config {

// Upper bounds on every size in a job config (docs/training.md lists them).
// They keep each product the worker allocates by far inside int64 and refuse
// a typo (2e9 for 2e3) before anything allocates; whether a job within them
// fits a machine is CheckWorkerMemory's question.
inline constexpr int kMaxTables = 1024;            // tables
inline constexpr int kMaxFeatures = 1024;          // features
inline constexpr int kMaxMlpLayers = 64;           // layers per MLP
inline constexpr int kMaxMlpWidth = 1 << 16;       // units per MLP layer
inline constexpr int64_t kMaxBatchSize = 1 << 20;  // samples per worker per step
inline constexpr int64_t kMaxSteps = 1'000'000'000;
inline constexpr int64_t kMaxEvalBatches = 100'000;  // held-out batches per evaluation
inline constexpr int kMaxStaleness = 10'000;       // BOUNDED mode, steps
inline constexpr int kMaxNumDense = 4096;          // data.synthetic.num_dense
inline constexpr int kMaxIdsPerBag = 1 << 16;      // data.synthetic ids per bag
inline constexpr int kMaxKeepLast = 10'000;        // training.checkpoint.keep_last

// Every check a job needs before it runs: tables (via the shard server's
// table checks), features naming known tables of one common dim, model
// widths that fit the features, training and data settings, each size
// within its bound above. Errors are INVALID_ARGUMENT and start with the
// field path, e.g. "features[3].table: unknown table 'ad'". Pure: reads
// nothing but `job` (the coordinator and the launcher call it too).
absl::Status ValidateJobConfig(const v1::JobConfig& job);

// How the tables a shard server serves differ from the job's, a phrase
// each ("it lacks the job's table 'x' (dim 8)", "table 'y' has dim 4, the
// job's has 8", "table 'z' differs from the job's (...)", "it serves table
// 'w', which the job 'j' does not have"); empty when they agree. At most
// about 16 phrases. The coordinator refuses such a server's registration.
std::vector<std::string> TableDifferences(
    const v1::JobConfig& job, const google::protobuf::RepeatedPtrField<v1::TableConfig>& served);

// Reads a text-format JobConfig and validates it.
absl::StatusOr<v1::JobConfig> ReadJobConfig(const std::string& path);

// The tables' common row width (the embedding dim). REQUIRES: validated.
int EmbeddingDim(const v1::JobConfig& job);

// The wire encoding of rows and gradients that training.wire_precision asks
// for (UNSPECIFIED: FLOAT32). REQUIRES: a validated job.
v1::RowEncoding WireEncoding(const v1::TrainingConfig& training);

// What one worker holds for a job, in bytes, by part. An estimate from the
// config (upper bounds where the data decide, e.g. every id of a batch
// distinct); the gRPC buffers of the embedding client are counted as one
// more copy of the looked-up rows.
struct WorkerMemoryEstimate {
  double dense_model = 0;      // parameters and their gradients
  double optimizer_state = 0;  // the dense optimizer's moments
  double activations = 0;      // the MLPs' and the interaction's, for a batch
  double embedding_buffers = 0;  // looked-up rows, their gradients, pooled bags
  double input_batches = 0;    // batches read ahead (prefetch queue)
  double evaluation = 0;       // held-out predictions and the loss history
  double total() const {
    return dense_model + optimizer_state + activations + embedding_buffers +
           input_batches + evaluation;
  }
};

// REQUIRES: ValidateJobConfig(job).ok().
WorkerMemoryEstimate EstimateWorkerMemory(const v1::JobConfig& job);

// OK when the estimate fits in `available_bytes`; else RESOURCE_EXHAUSTED
// naming the estimate by part, `available_from` (e.g. "MemAvailable in
// /proc/meminfo") and the setting to lower first (the largest part's).
// REQUIRES: ValidateJobConfig(job).ok().
absl::Status CheckWorkerMemory(const v1::JobConfig& job, int64_t available_bytes,
                               absl::string_view available_from);

// MemAvailable from the text of /proc/meminfo, in bytes; NOT_FOUND when the
// text has no such line.
absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo);

}  // namespace recps::config

#endif  // RECPS_COMMON_CONFIG_JOB_CONFIG_H_

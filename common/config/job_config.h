// The job config (recps.v1.JobConfig): reading it and checking it as a whole
// before anything starts, with errors that name the field.
#ifndef RECPS_COMMON_CONFIG_JOB_CONFIG_H_
#define RECPS_COMMON_CONFIG_JOB_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "recps/v1/job.pb.h"

namespace recps::config {

// Every check a job needs before it runs: tables (via the shard server's
// table checks), features naming known tables of one common dim, model
// widths that fit the features, training and data settings. Errors are
// INVALID_ARGUMENT and start with the field path, e.g.
// "features[3].table: unknown table 'ad'".
absl::Status ValidateJobConfig(const v1::JobConfig& job);

// Reads a text-format JobConfig and validates it.
absl::StatusOr<v1::JobConfig> ReadJobConfig(const std::string& path);

// The tables' common row width (the embedding dim). REQUIRES: validated.
int EmbeddingDim(const v1::JobConfig& job);

}  // namespace recps::config

#endif  // RECPS_COMMON_CONFIG_JOB_CONFIG_H_

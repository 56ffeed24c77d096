// Turns table configuration (recps.v1.TableConfig, from a text-format file)
// into the store's TableSpecs, with errors that name the table and field.
#ifndef RECPS_COMMON_CONFIG_TABLE_CONFIG_H_
#define RECPS_COMMON_CONFIG_TABLE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recps/v1/table.pb.h"
#include "common/config/table_spec.h"

namespace recps::config {

// An optimizer config with defaults applied (eps 1e-8, betas 0.9/0.999).
// INVALID_ARGUMENT, starting with the field ("kind ...", "learning_rate
// ..."), for an unset kind or bad hyper-parameters.
absl::StatusOr<OptimizerParams> OptimizerParamsFromConfig(
    const v1::OptimizerConfig& config);

// Applies defaults (eps 1e-8, betas 0.9/0.999, init uniform +-1/sqrt(dim),
// precision FP32) and checks every field; INVALID_ARGUMENT says which table and field.
absl::StatusOr<TableSpec> TableSpecFromConfig(const v1::TableConfig& config);
absl::StatusOr<std::vector<TableSpec>> TableSpecsFromConfig(
    const v1::TablesConfig& config);

// Reads a text-format TablesConfig file; parse errors name the file, line
// and column.
absl::StatusOr<v1::TablesConfig> ReadTablesConfig(const std::string& path);

}  // namespace recps::config

#endif  // RECPS_COMMON_CONFIG_TABLE_CONFIG_H_

// A table as the store, the worker and the planner see it: name, row width,
// row count, optimizer and initialisation, validated from its config by
// common/config/table_config.h.
#ifndef RECPS_COMMON_CONFIG_TABLE_SPEC_H_
#define RECPS_COMMON_CONFIG_TABLE_SPEC_H_

#include <cstdint>
#include <string>

#include "common/fused_row.h"
#include "common/optimizer_registry.h"
#include "common/row_init.h"
// Not needed here: kept for the files that still name kernels:: types
// through this header (server/store/embedding_store.h's
// RowPrecision); the issue 34 follow-up in server/ drops them.
#include "kernels/embedding_optimizer.h"
#include "kernels/optimizer.h"

namespace recps::config {

struct TableSpec {
  std::string name;
  int dim = 0;
  // 0: dynamic (any int64 id, rows created on first touch); N > 0: ids in
  // [0, N), others refused.
  int64_t num_rows = 0;
  OptimizerParams optimizer;
  RowInit init;
  // Weight storage of the host store (optimizer state stays fp32).
  RowPrecision precision = RowPrecision::kFp32;
  // 16-bit weights only: stochastic instead of nearest-even rounding.
  bool stochastic_rounding = false;
};

}  // namespace recps::config

#endif  // RECPS_COMMON_CONFIG_TABLE_SPEC_H_

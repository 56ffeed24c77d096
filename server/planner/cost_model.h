// The cost model: what a table (or a column group of it) costs the server
// that holds some of its slots, in bytes stored and in traffic and work per
// step, and the step time that follows. Formulas: docs/planner.md.
#ifndef RECPS_SERVER_PLANNER_COST_MODEL_H_
#define RECPS_SERVER_PLANNER_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/fused_row.h"
#include "common/human_bytes.h"
#include "common/optimizer_registry.h"
#include "recps/v1/plan.pb.h"
#include "server/planner/table_model.h"

namespace recps::planner {

// Bytes of one stored row of `width` columns: weights and optimizer state
// side by side, padded like the shard server pads them
// (server::HostRowBytes).
int64_t StoredRowBytes(OptimizerKind optimizer, int width,
                       v1::StoragePrecision precision);
// The weights' part of StoredRowBytes (without padding).
int64_t WeightRowBytes(int width, v1::StoragePrecision precision);
RowPrecision KernelPrecision(v1::StoragePrecision precision);

// One server's load; loads add up.
struct Load {
  double rows = 0;
  double weight_bytes = 0;
  double optimizer_bytes = 0;
  double index_bytes = 0;
  double lookup_ids = 0;    // per step, all workers
  double lookup_bytes = 0;  // per step
  double update_bytes = 0;  // per step
  double rows_touched = 0;  // per step: lookups + updates
  double table_parts = 0;   // per step: table parts of requests served

  double bytes_stored() const {
    return weight_bytes + optimizer_bytes + index_bytes;
  }
  Load& operator+=(const Load& o);
};

// The load of columns [column_begin, column_end) of `table` on a server
// that owns `slots` of the table's slot layout (the whole table: all
// num_slots). Rows and traffic follow the rows in those slots.
Load UnitLoad(const TableModel& table, int column_begin, int column_end,
              const std::vector<uint32_t>& slots, uint32_t num_slots);
// The same for a server owning every slot (table-wise, a column group).
Load WholeUnitLoad(const TableModel& table, int column_begin, int column_end);

// Index bytes every server spends on `table` whatever the placement: the
// store keeps a map object and a row counter per slot for each table, and
// an id -> row map for small fixed ones.
double FixedTableBytes(const TableModel& table, uint32_t num_slots);
// The sum over the model's tables: what each server spends before any row.
double FixedBytesPerServer(const Model& m);

struct StepTime {
  double network_seconds = 0;
  double compute_seconds = 0;
  double step_seconds = 0;  // max of the two
};
StepTime StepTimeOf(const Load& load, const ServerModel& server);

v1::Estimate ToEstimate(const Load& load);

}  // namespace recps::planner

#endif  // RECPS_SERVER_PLANNER_COST_MODEL_H_

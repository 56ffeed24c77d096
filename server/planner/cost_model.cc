#include "server/planner/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "server/store/store_footprint.h"

namespace recps::planner {
namespace {

// On the wire an id is an int64 and a row or gradient float32 columns.
constexpr double kIdWireBytes = 8;
constexpr double kValueWireBytes = 4;

}  // namespace

int64_t WeightRowBytes(int width, v1::StoragePrecision precision) {
  return int64_t{width} * (precision == v1::FP16 || precision == v1::BF16 ? 2 : 4);
}

RowPrecision KernelPrecision(v1::StoragePrecision precision) {
  switch (precision) {
    case v1::FP16:
      return RowPrecision::kFp16;
    case v1::BF16:
      return RowPrecision::kBf16;
    default:
      return RowPrecision::kFp32;
  }
}

int64_t StoredRowBytes(OptimizerKind optimizer, int width,
                       v1::StoragePrecision precision) {
  // What the host store allocates per row (TableInfo.row_bytes).
  return server::HostRowBytes(optimizer, width, KernelPrecision(precision));
}

Load& Load::operator+=(const Load& o) {
  rows += o.rows;
  weight_bytes += o.weight_bytes;
  optimizer_bytes += o.optimizer_bytes;
  index_bytes += o.index_bytes;
  lookup_ids += o.lookup_ids;
  lookup_bytes += o.lookup_bytes;
  update_bytes += o.update_bytes;
  rows_touched += o.rows_touched;
  table_parts += o.table_parts;
  return *this;
}

double FixedTableBytes(const TableModel& table, uint32_t num_slots) {
  return static_cast<double>(num_slots) *
             static_cast<double>(server::HostIndexBytesPerSlot()) +
         table.dense_index_bytes;
}

double FixedBytesPerServer(const Model& m) {
  double bytes = 0;
  for (const TableModel& t : m.tables) bytes += FixedTableBytes(t, m.num_slots);
  return bytes;
}

namespace {

Load LoadOfRows(const TableModel& t, int column_begin, int column_end,
                double rows, double index_bytes) {
  const int width = column_end - column_begin;
  Load l;
  l.rows = rows;
  const double row_bytes =
      static_cast<double>(StoredRowBytes(t.optimizer, width, t.precision));
  const double weight = static_cast<double>(WeightRowBytes(width, t.precision));
  l.weight_bytes = rows * weight;
  l.optimizer_bytes = rows * (row_bytes - weight);
  l.index_bytes = index_bytes;
  // Ids are looked up in proportion to the rows a server holds (each row
  // equally likely).
  const double share = t.rows > 0 ? rows / static_cast<double>(t.rows) : 0;
  l.lookup_ids = t.ids_per_step * share;
  const double per_id = kIdWireBytes + kValueWireBytes * width;
  l.lookup_bytes = l.lookup_ids * per_id;
  l.update_bytes = l.lookup_ids * per_id;
  l.rows_touched = 2 * l.lookup_ids;
  // Every worker's lookup and push carry a part for this table to each
  // server that holds some of its rows.
  l.table_parts = rows > 0 ? 2.0 * t.num_workers : 0.0;
  return l;
}

}  // namespace

Load UnitLoad(const TableModel& t, int column_begin, int column_end,
              const std::vector<uint32_t>& slots, uint32_t num_slots) {
  double rows = 0, index = 0;
  if (!t.rows_per_slot.empty()) {
    for (uint32_t s : slots) {
      rows += static_cast<double>(t.rows_per_slot[s]);
      index += t.index_bytes_of_slot[s];
    }
  } else {
    rows = static_cast<double>(t.rows) * slots.size() / num_slots;
    index = t.index_bytes_per_slot * slots.size();
  }
  return LoadOfRows(t, column_begin, column_end, rows, index);
}

Load WholeUnitLoad(const TableModel& t, int column_begin, int column_end) {
  return LoadOfRows(t, column_begin, column_end, static_cast<double>(t.rows),
                    t.index_bytes);
}

StepTime StepTimeOf(const Load& load, const ServerModel& server) {
  StepTime s;
  s.network_seconds =
      (load.lookup_bytes + load.update_bytes) / server.network_bytes_per_s;
  s.compute_seconds = load.rows_touched * server.row_seconds +
                      load.table_parts * server.table_request_seconds;
  s.step_seconds = std::max(s.network_seconds, s.compute_seconds);
  return s;
}

v1::Estimate ToEstimate(const Load& l) {
  v1::Estimate e;
  e.set_rows(std::llround(l.rows));
  e.set_weight_bytes(std::llround(l.weight_bytes));
  e.set_optimizer_bytes(std::llround(l.optimizer_bytes));
  e.set_index_bytes(std::llround(l.index_bytes));
  e.set_bytes_stored(e.weight_bytes() + e.optimizer_bytes() + e.index_bytes());
  e.set_lookup_ids_per_step(l.lookup_ids);
  e.set_lookup_bytes_per_step(l.lookup_bytes);
  e.set_update_bytes_per_step(l.update_bytes);
  return e;
}

}  // namespace recps::planner

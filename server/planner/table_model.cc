#include "server/planner/table_model.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/fused_row.h"
#include "common/hashing.h"
#include "common/optimizer_registry.h"
#include "common/status_macros.h"
#include "server/store/store_footprint.h"
#include "common/config/table_config.h"

namespace recps::planner {
namespace {

constexpr double kDefaultNetworkBytesPerS = 1.25e9;
constexpr double kDefaultCpuRowSeconds = 1e-7;
constexpr double kDefaultGpuRowSeconds = 1e-8;
constexpr double kDefaultTableRequestSeconds = 5e-6;
constexpr uint32_t kDefaultNumSlots = 4096;
// recps-shard's --max_rows_per_table default.
constexpr int64_t kDefaultMaxRowsPerTable = int64_t{1} << 26;
// Fixed tables up to this many rows are hashed id by id, so row-wise
// placement of a small table sees its real (uneven) spread over slots;
// larger ones spread evenly to well under 1%, and hashing every id of many
// large tables would make planning slow.
constexpr int64_t kExactSlotCountRows = int64_t{1} << 16;

absl::Status BadServer(int i, const v1::ServerSpec& s, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("topology: server ", i, " ('", s.address(), "'): ", what));
}

absl::Status BadHint(const v1::TableHint& h, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("hint for table '", h.table(), "': ", what));
}

// The value paired with `name`, or `fallback`.
template <typename T>
T LookupDefault(const std::vector<std::pair<std::string, T>>& pairs,
                const std::string& name, T fallback) {
  for (const auto& [n, v] : pairs) {
    if (n == name) return v;
  }
  return fallback;
}

// Server i of the topology with its defaults applied.
absl::StatusOr<ServerModel> ModelServer(int i, const v1::ServerSpec& s,
                                        double memory_reserve_fraction) {
  if (s.memory_bytes() <= 0) {
    return BadServer(i, s,
                     absl::StrCat("memory_bytes is ", s.memory_bytes(),
                                  "; it must be > 0"));
  }
  if (s.network_bytes_per_s() < 0 || s.row_seconds() < 0 ||
      s.table_request_seconds() < 0) {
    return BadServer(i, s,
                     "network_bytes_per_s, row_seconds and "
                     "table_request_seconds must be >= 0 (0: default)");
  }
  ServerModel sm;
  sm.address = s.address();
  sm.usable_bytes = static_cast<int64_t>(
      static_cast<double>(s.memory_bytes()) * (1 - memory_reserve_fraction));
  sm.network_bytes_per_s = s.network_bytes_per_s() > 0
                               ? s.network_bytes_per_s()
                               : kDefaultNetworkBytesPerS;
  sm.row_seconds = s.row_seconds() > 0     ? s.row_seconds()
                   : s.device() == v1::GPU ? kDefaultGpuRowSeconds
                                           : kDefaultCpuRowSeconds;
  if (s.max_rows_per_table() < 0) {
    return BadServer(i, s, "max_rows_per_table must be >= 0 (0: 2^26)");
  }
  sm.max_rows_per_table = s.max_rows_per_table() > 0
                              ? s.max_rows_per_table()
                              : kDefaultMaxRowsPerTable;
  sm.table_request_seconds = s.table_request_seconds() > 0
                                 ? s.table_request_seconds()
                                 : kDefaultTableRequestSeconds;
  return sm;
}

// The topology's figures (slots, workers, batch) and its servers with
// their defaults applied; `server_index` gets each address's index.
absl::Status ModelServers(const PlannerInput& input, Model* m,
                          absl::flat_hash_map<std::string, int>* server_index) {
  const v1::Topology& topo = input.topology;
  if (topo.servers_size() == 0) {
    return absl::InvalidArgumentError("topology: no shard servers");
  }
  if (topo.num_workers() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: num_workers is ", topo.num_workers(), "; it must be >= 1"));
  }
  if (topo.batch_size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: batch_size is ", topo.batch_size(), "; it must be >= 1"));
  }
  if (!(input.memory_reserve_fraction >= 0 &&
        input.memory_reserve_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_reserve_fraction is ",
                     input.memory_reserve_fraction, "; it must be in [0, 1)"));
  }
  m->num_slots = topo.num_slots() == 0 ? kDefaultNumSlots : topo.num_slots();
  m->num_workers = topo.num_workers();
  m->batch_size = topo.batch_size();
  m->memory_reserve_fraction = input.memory_reserve_fraction;
  for (int i = 0; i < topo.servers_size(); ++i) {
    const v1::ServerSpec& s = topo.servers(i);
    if (s.address().empty()) return BadServer(i, s, "address is empty");
    if (!server_index->emplace(s.address(), i).second) {
      return BadServer(i, s, "address listed twice");
    }
    ASSIGN_OR_RETURN(ServerModel sm, ModelServer(i, s, input.memory_reserve_fraction));
    m->servers.push_back(std::move(sm));
  }
  return absl::OkStatus();
}

// The tables from their configs (checked as the shard server checks them);
// `table_index` gets each name's index.
absl::Status ModelTables(const PlannerInput& input, Model* m,
                         absl::flat_hash_map<std::string, int>* table_index) {
  if (input.tables.empty())
    return absl::InvalidArgumentError("no tables to plan");
  for (size_t t = 0; t < input.tables.size(); ++t) {
    absl::StatusOr<config::TableSpec> spec =
        config::TableSpecFromConfig(input.tables[t]);
    if (!spec.ok()) return spec.status();
    if (!table_index->emplace(spec->name, static_cast<int>(t)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", spec->name, "' is declared twice"));
    }
    TableModel tm;
    tm.name = spec->name;
    tm.key = StableNameKey(tm.name);
    tm.dim = spec->dim;
    tm.optimizer = spec->optimizer.kind;
    switch (spec->precision) {
      case RowPrecision::kFp32:
        tm.precision = v1::FP32;
        break;
      case RowPrecision::kFp16:
        tm.precision = v1::FP16;
        break;
      case RowPrecision::kBf16:
        tm.precision = v1::BF16;
        break;
    }
    tm.rows = spec->num_rows;
    tm.dynamic = spec->num_rows == 0;
    tm.num_workers = m->num_workers;
    for (int i = 0; i < static_cast<int>(m->servers.size()); ++i) {
      tm.allowed_servers.push_back(i);
    }
    m->tables.push_back(std::move(tm));
  }
  return absl::OkStatus();
}

// Each table's hint (null: none), by table index.
absl::StatusOr<std::vector<const v1::TableHint*>> HintsByTable(
    const PlannerInput& input, size_t num_tables,
    const absl::flat_hash_map<std::string, int>& table_index) {
  std::vector<const v1::TableHint*> hint_of(num_tables, nullptr);
  for (const v1::TableHint& h : input.hints) {
    auto it = table_index.find(h.table());
    if (it == table_index.end()) return BadHint(h, "no such table in the job");
    if (hint_of[it->second] != nullptr) return BadHint(h, "given twice");
    hint_of[it->second] = &h;
  }
  return hint_of;
}

// Ids per sample of each table, before lookup shares.
absl::StatusOr<std::vector<double>> PoolingByTable(
    const PlannerInput& input, const Model& m,
    const std::vector<const v1::TableHint*>& hint_of) {
  std::vector<double> pooling(m.tables.size());
  for (size_t t = 0; t < m.tables.size(); ++t) {
    const v1::TableHint* h = hint_of[t];
    if (h != nullptr && h->pooling_factor() < 0) {
      return BadHint(*h, "pooling_factor must be >= 0 (0: default)");
    }
    pooling[t] =
        h != nullptr && h->pooling_factor() > 0
            ? h->pooling_factor()
            : LookupDefault(input.default_pooling, m.tables[t].name, 1.0);
  }
  return pooling;
}

// The rows the table will hold: the hint's expected distinct ids, capped
// by a fixed table's size; and the dense index of a fixed table.
absl::Status ApplyRows(const PlannerInput& input, const v1::TableHint& h,
                       TableModel* tm) {
  if (h.expected_distinct_ids() < 0) {
    return BadHint(h, "expected_distinct_ids must be >= 0");
  }
  const int64_t fixed_rows = tm->rows;
  tm->dense_index_bytes = static_cast<double>(server::HostDenseIndexBytes(fixed_rows));
  if (h.expected_distinct_ids() > 0) {
    tm->rows = fixed_rows > 0 ? std::min(fixed_rows, h.expected_distinct_ids())
                             : h.expected_distinct_ids();
  } else if (fixed_rows == 0) {
    tm->rows = LookupDefault(input.default_distinct_ids, tm->name, int64_t{0});
    if (tm->rows <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", tm->name,
                       "' is dynamic (num_rows 0): give a hint with "
                       "expected_distinct_ids, the rows it will hold"));
    }
  }
  return absl::OkStatus();
}

// The store keeps what the table config says: a hint may repeat its
// precision but not change it, or the plan's bytes would not be the
// servers'.
absl::Status CheckHintPrecision(const v1::TableHint& h, const TableModel& tm) {
  if (h.precision() == v1::STORAGE_PRECISION_UNSPECIFIED ||
      h.precision() == tm.precision) {
    return absl::OkStatus();
  }
  if (!v1::StoragePrecision_IsValid(h.precision())) {
    return BadHint(h, absl::StrCat("unknown precision ", h.precision()));
  }
  return BadHint(
      h, absl::StrCat("precision ", v1::StoragePrecision_Name(h.precision()),
                      " differs from the table config's ",
                      v1::StoragePrecision_Name(tm.precision),
                      "; shard servers store what the table config "
                      "says: set `precision: ",
                      v1::StoragePrecision_Name(h.precision()),
                      "` in the table config (and leave the hint's "
                      "unset)"));
}

// The hint's pinned sharding type and column groups.
absl::Status ApplyPinnedType(const v1::TableHint& h, TableModel* tm) {
  tm->pinned_type = h.pinned_type();
  if (tm->pinned_type < v1::SHARDING_TYPE_UNSPECIFIED ||
      tm->pinned_type > v1::COLUMN_WISE) {
    return BadHint(h, absl::StrCat("unknown pinned_type ", h.pinned_type()));
  }
  if (h.column_groups() < 0 || h.column_groups() == 1) {
    return BadHint(h, "column_groups must be 0 (the planner chooses) or >= 2");
  }
  if (h.column_groups() > 0) {
    if (tm->pinned_type != v1::SHARDING_TYPE_UNSPECIFIED &&
        tm->pinned_type != v1::COLUMN_WISE) {
      return BadHint(
          h, "column_groups is set but the table is pinned to another type");
    }
    if (h.column_groups() > tm->dim) {
      return BadHint(h, absl::StrCat("column_groups ", h.column_groups(),
                                     " exceeds the table's dim ", tm->dim));
    }
    tm->column_groups = h.column_groups();
    tm->pinned_type = v1::COLUMN_WISE;
  }
  const OptimizerInfo& optimizer = *FindOptimizer(tm->optimizer);
  if (tm->pinned_type == v1::COLUMN_WISE &&
      optimizer.unsplittable_because != nullptr) {
    return BadHint(
        h, absl::StrCat(
               "the table uses ", optimizer.display_name, ", which ",
               optimizer.unsplittable_because,
               ": split column-wise, each group would keep its own and train "
               "differently from the unsplit table; pin it TABLE_WISE or "
               "ROW_WISE, or use ",
               FindOptimizer(optimizer.instead)->config_name));
  }
  return absl::OkStatus();
}

// The hint's pinned servers, and whether its column groups fit them.
absl::Status ApplyPinnedServers(
    const v1::TableHint& h,
    const absl::flat_hash_map<std::string, int>& server_index, TableModel* tm) {
  if (h.pinned_servers_size() > 0) {
    tm->allowed_servers.clear();
    absl::flat_hash_set<int> seen;
    for (const std::string& address : h.pinned_servers()) {
      auto it = server_index.find(address);
      if (it == server_index.end()) {
        return BadHint(h, absl::StrCat("pinned server '", address,
                                       "' is not in the topology"));
      }
      if (seen.insert(it->second).second)
        tm->allowed_servers.push_back(it->second);
    }
    std::sort(tm->allowed_servers.begin(), tm->allowed_servers.end());
    tm->servers_pinned = true;
  }
  if (tm->column_groups > static_cast<int>(tm->allowed_servers.size())) {
    return BadHint(h, absl::StrCat("column_groups ", tm->column_groups,
                                   " needs as many servers; ",
                                   tm->allowed_servers.size(), " are allowed"));
  }
  return absl::OkStatus();
}

// Rows per slot of a small fixed table (`fixed_rows`, all held), and the
// index bytes of the table and of its slots.
void ApplyIndexBytes(const Model& m, int64_t fixed_rows, TableModel* tm) {
  if (fixed_rows > 0 && tm->rows == fixed_rows &&
      fixed_rows <= kExactSlotCountRows) {
    tm->rows_per_slot.assign(m.num_slots, 0);
    for (int64_t id = 0; id < fixed_rows; ++id) {
      ++tm->rows_per_slot[SlotOf(tm->key, id, m.num_slots)];
    }
  }
  tm->index_bytes_per_slot =
      ExpectedIndexBytesPerSlot(static_cast<double>(tm->rows) / m.num_slots);
  tm->index_bytes = tm->index_bytes_per_slot * m.num_slots;
  if (!tm->rows_per_slot.empty()) {
    tm->index_bytes = 0;
    tm->index_bytes_of_slot.resize(m.num_slots);
    for (uint32_t s = 0; s < m.num_slots; ++s) {
      tm->index_bytes_of_slot[s] = static_cast<double>(
          server::HostIndexBytesForRows(tm->rows_per_slot[s]) +
          server::HostRowIdBytes(tm->rows_per_slot[s]));
      tm->index_bytes += tm->index_bytes_of_slot[s];
    }
  }
}

}  // namespace

double ExpectedDistinct(double n, double rows) {
  if (n <= 0 || rows <= 0) return 0;
  return -rows * std::expm1(-n / rows);
}

double ExpectedIndexBytesPerSlot(double mean_rows) {
  if (mean_rows <= 0) return 0;
  const double spread = 8 * std::sqrt(mean_rows) + 10;
  const auto lo = static_cast<int64_t>(std::max(0.0, mean_rows - spread));
  const auto hi = static_cast<int64_t>(mean_rows + spread);
  // At most ~4000 terms: for huge means, sample every stride-th count (the
  // bytes are a step function with steps far apart there).
  const int64_t stride = std::max<int64_t>(1, (hi - lo) / 4000);
  double bytes = 0;
  for (int64_t k = lo; k <= hi; k += stride) {
    const double log_p =
        k * std::log(mean_rows) - mean_rows - std::lgamma(k + 1.0);
    bytes += stride * std::exp(log_p) *
             static_cast<double>(server::HostIndexBytesForRows(k));
  }
  // The row -> id array is linear in the rows: its mean is exact.
  return bytes + mean_rows * static_cast<double>(server::HostRowIdBytes(1));
}

absl::StatusOr<Model> BuildModel(const PlannerInput& input) {
  Model m;
  absl::flat_hash_map<std::string, int> server_index;
  RETURN_IF_ERROR(ModelServers(input, &m, &server_index));
  absl::flat_hash_map<std::string, int> table_index;
  RETURN_IF_ERROR(ModelTables(input, &m, &table_index));
  ASSIGN_OR_RETURN(const std::vector<const v1::TableHint*> hint_of,
                   HintsByTable(input, m.tables.size(), table_index));
  ASSIGN_OR_RETURN(const std::vector<double> pooling,
                   PoolingByTable(input, m, hint_of));
  double total_pooling = 0;
  for (double p : pooling) total_pooling += p;

  for (size_t t = 0; t < m.tables.size(); ++t) {
    TableModel& tm = m.tables[t];
    const v1::TableHint none;
    const v1::TableHint& h = hint_of[t] != nullptr ? *hint_of[t] : none;
    const int64_t fixed_rows = tm.rows;
    RETURN_IF_ERROR(ApplyRows(input, h, &tm));
    if (!(h.lookup_share() >= 0 && h.lookup_share() <= 1)) {
      return BadHint(
          h, "lookup_share must be in [0, 1] (0: from the pooling factor)");
    }
    const double per_sample =
        h.lookup_share() > 0 ? h.lookup_share() * total_pooling : pooling[t];
    tm.ids_per_step =
        m.num_workers *
        ExpectedDistinct(per_sample * static_cast<double>(m.batch_size),
                         static_cast<double>(tm.rows));
    RETURN_IF_ERROR(CheckHintPrecision(h, tm));
    RETURN_IF_ERROR(ApplyPinnedType(h, &tm));
    RETURN_IF_ERROR(ApplyPinnedServers(h, server_index, &tm));
    ApplyIndexBytes(m, fixed_rows, &tm);
  }
  return m;
}

}  // namespace recps::planner

// The store's checks of a request against a table, with their messages:
// one copy for the host store (host_table.h), the device store
// (device_store/device_store.cc) and the shard server's own pre-check of a
// whole lookup (shard_server.cc), so the three never word an error apart.
#ifndef RECPS_SERVER_STORE_TABLE_CHECKS_H_
#define RECPS_SERVER_STORE_TABLE_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/config/table_spec.h"

namespace recps::server {

// INVALID_ARGUMENT "table 'x': id 10 (position 0) is outside [0, 10)" for
// the first id outside a fixed table's rows; OK for a dynamic table.
inline absl::Status CheckIdsInRange(const config::TableSpec& spec,
                                    absl::Span<const int64_t> ids) {
  if (spec.num_rows == 0) return absl::OkStatus();
  for (size_t p = 0; p < ids.size(); ++p) {
    if (ids[p] < 0 || ids[p] >= spec.num_rows) {
      return absl::InvalidArgumentError(absl::StrCat("table '", spec.name, "': id ", ids[p],
                                                     " (position ", p, ") is outside [0, ",
                                                     spec.num_rows, ")"));
    }
  }
  return absl::OkStatus();
}

// RESOURCE_EXHAUSTED: the table holds `capacity` rows, its limit.
inline absl::Status TableFullError(const config::TableSpec& spec, int64_t capacity) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "table '", spec.name, "' is full: it holds ", capacity, " rows (",
      spec.num_rows > 0 ? "its num_rows" : "StoreOptions.max_rows_per_table", ")"));
}

}  // namespace recps::server

#endif  // RECPS_SERVER_STORE_TABLE_CHECKS_H_

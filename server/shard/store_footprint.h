// What the host store's rows and index cost in memory, published for the
// sharding planner (server/planner/) so that it need not include the store.
// One owner for each formula: the store reports its own sizes with these.
#ifndef RECPS_SERVER_SHARD_STORE_FOOTPRINT_H_
#define RECPS_SERVER_SHARD_STORE_FOOTPRINT_H_

#include <cstdint>

#include "kernels/embedding_optimizer.h"

namespace recps::server {

// Bytes of one stored row of the host store (TableInfo.row_bytes): the
// fused row of kernels/embedding_optimizer.h in `precision` (16-bit
// weights, fp32 optimizer state, padded to 16 bytes).
int64_t HostRowBytes(kernels::OptimizerKind kind, int dim,
                     kernels::RowPrecision precision);

// Memory of the host store's id index, for TableInfo.index_bytes and the
// sharding planner's estimate (one owner for the formula). Every table keeps
// one IdIndex (server/id_index.h) and one row counter per slot of the cluster:
// HostIndexBytesPerSlot() each, plus what a slot's map allocates for `rows`
// rows (HostIndexBytesForRows) or at `capacity` (HostIndexAllocBytes).
int64_t HostIndexBytesPerSlot();
int64_t HostIndexBytesForRows(int64_t rows);
int64_t HostIndexAllocBytes(int64_t capacity);
// Bytes of the table's row -> id array for `rows` stored rows (what lets
// DropSlot compact the arena); part of TableInfo.index_bytes.
int64_t HostRowIdBytes(int64_t rows);

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_STORE_FOOTPRINT_H_

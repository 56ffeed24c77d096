// What the host store's rows and index cost in memory, published for the
// sharding planner (server/planner/) so that it need not include the store.
// One owner for each formula: the store reports its own sizes with these.
#ifndef RECPS_SERVER_STORE_STORE_FOOTPRINT_H_
#define RECPS_SERVER_STORE_STORE_FOOTPRINT_H_

#include <cstdint>

#include "kernels/embedding_optimizer.h"

namespace recps::server {

// Bytes of one stored row of the host store (TableInfo.row_bytes): the
// fused row of kernels/embedding_optimizer.h in `precision` (16-bit
// weights, fp32 optimizer state, padded to 16 bytes).
int64_t HostRowBytes(OptimizerKind kind, int dim,
                     RowPrecision precision);

// Memory of the host store's id index, for TableInfo.index_bytes and the
// sharding planner's estimate (one owner for the formula). Every table keeps
// one IdIndex (server/store/id_index.h) and one row counter per slot of the cluster:
// HostIndexBytesPerSlot() each, plus what a slot's map allocates for `rows`
// rows (HostIndexBytesForRows) or at `capacity` (HostIndexAllocBytes).
int64_t HostIndexBytesPerSlot();
int64_t HostIndexBytesForRows(int64_t rows);
int64_t HostIndexAllocBytes(int64_t capacity);
// Bytes of the table's row -> id array for `rows` stored rows (what lets
// DropSlot compact the arena); part of TableInfo.index_bytes.
int64_t HostRowIdBytes(int64_t rows);

// Fixed tables (num_rows > 0) of at most this many rows also keep a flat
// id -> row map (server/store/host_table.h, Table::dense_rows) on every
// server: 4 bytes per id of the table, whatever share of it the server
// holds (its pages are touched as rows appear, and ids spread over all of
// them). Larger tables rely on the slot indexes alone.
inline constexpr int64_t kHostDenseIndexMaxRows = int64_t{1} << 24;
// Bytes of that map for a table of `num_rows` (0: none); part of
// TableInfo.index_bytes and of the planner's fixed bytes per table.
int64_t HostDenseIndexBytes(int64_t num_rows);

// Rows of a fixed table of `num_rows` that a server holding `share` of its
// ids should expect (2% and 64 rows over, for the uneven spread of ids
// over slots): what committing memory ahead (StoreOptions::
// prefault_fixed_share, EmbeddingStore::CommitFixedRows) covers. 0 for no
// share.
int64_t ExpectedFixedRows(int64_t num_rows, double share);

// The memory of GPU `cuda_device` a GPU store's rows may use (its total
// bytes, as the shard server reports it to the sharding planner); 0 when it
// cannot be read (no GPU, a build without CUDA).
int64_t DeviceStoreMemoryBytes(int cuda_device);

}  // namespace recps::server

#endif  // RECPS_SERVER_STORE_STORE_FOOTPRINT_H_

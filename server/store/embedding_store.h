// The shard server's table store: rows of the slots this server owns, each
// holding weights and optimizer state side by side. The shard server and
// the checkpoints talk to these interfaces only, so a GPU-resident store or
// a RocksDB-backed tier can replace or wrap the host-memory one without
// touching request handling.
//
// Thread-safety: every method may be called concurrently, the slot transfer
// methods (ExportSlot, ImportRows, DropSlot) too: they run while lookups and
// pushes go on; each says what it blocks and what it may miss.
#ifndef RECPS_SERVER_STORE_EMBEDDING_STORE_H_
#define RECPS_SERVER_STORE_EMBEDDING_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/config/table_spec.h"
#include "common/row_init.h"
#include "common/thread_pool.h"
#include "kernels/exec_context.h"
#include "kernels/optimizer.h"

namespace recps::server {

struct StoreOptions {
  // Seed of the deterministic row initialisation (the job's seed).
  uint64_t seed = 0;
  // The cluster's slot count (common/hashing.h SlotOf); rows are indexed by
  // slot so that stats and, later, migration work per slot.
  uint32_t num_slots = 4096;
  // Most rows a dynamic table may hold on this server; address space for
  // them is reserved up front, memory is committed as rows appear.
  int64_t max_rows_per_table = int64_t{1} << 26;
  // Splits large batches over cores; nullptr runs on the calling thread.
  ThreadPool* pool = nullptr;
  // Where rows live and the update kernels run (kernels/exec_context.h).
  // CreateEmbeddingStore picks the implementation from it.
  kernels::Device device = kernels::Device::kCpu;
  int cuda_device = 0;
  // Host store: commit, when the store is created, the memory of this share
  // of every fixed table's rows (num_rows x share, a little more), as if
  // they had been written. 0: none; memory is committed as rows appear. A
  // first touch of fresh memory costs far more than a later write (on the
  // VMs measured, 0.4-2 GB/s against 10+ GB/s), and a lazily created row
  // pays it inside a training step; TorchRec pays it when it builds its
  // tables. Contents are unchanged: rows are still created on first use.
  double prefault_fixed_share = 0;
};

// Where a slot export (EmbeddingStore::ExportSlot) stands: the next chunk
// holds ids > last_id, or the slot's smallest ids while !started. Plain
// data, so a checkpoint writer or a migration can keep it between calls.
struct SlotCursor {
  bool started = false;
  int64_t last_id = 0;  // largest id exported so far (when started)
  bool done = false;    // no id > last_id was stored at the last chunk
};

// One chunk of a slot export: ids in ascending order and their whole fused
// rows (row_stride floats each: weights, optimizer state, padding; see
// kernels/embedding_optimizer.h). The optimizer state includes Adam's
// per-row step count, kept inside the row (a uint32 in the float after m
// and v), so it travels with the row as is.
struct SlotChunk {
  int64_t row_stride = 0;    // FusedRowStride(kind, dim)
  std::vector<int64_t> ids;  // ascending
  std::vector<float> rows;   // ids.size() x row_stride
};

// A (table, slot) unit of a store: what slot moves, holds and checkpoint
// selections name.
using StoreUnit = std::pair<int, uint32_t>;

struct TableInfo {
  std::string name;
  int dim = 0;
  int64_t rows = 0;        // rows stored
  int64_t row_bytes = 0;   // bytes per stored row (weights + state, padded)
  // Bytes of the id -> row index (per-slot index arrays and bookkeeping).
  int64_t index_bytes = 0;
  int64_t lookup_ids = 0;  // ids served since start
  int64_t update_ids = 0;  // gradient rows applied since start
  // Bytes of row storage committed ahead of the rows (a fixed table's
  // share, --prefault_fixed_tables); 0 where memory comes as rows appear.
  int64_t committed_bytes = 0;
};

// A store has three roles, each used by different callers; a caller holds
// the narrowest one it needs:
//   RowDataPlane    lookups and pushes (the shard server's data plane,
//                   the embedded shard of a worker);
//   SlotTransfer    rows moving by slot (slot moves, live checkpoints,
//                   restores, drops, per-slot sizes);
//   SnapshotSource  the rows as they were at a cut (checkpoints while
//                   training runs).
// All three share the store's tables (StoreCatalog). A new tier (an SSD
// store under the host store, an HBM cache over it) implements all three;
// a read-only serving store needs RowDataPlane only.

// The tables of a store and the slot count its rows are keyed by.
class StoreCatalog {
 public:
  virtual ~StoreCatalog() = default;

  virtual int num_tables() const = 0;
  virtual const config::TableSpec& spec(int table) const = 0;
  // Index of table `name`; NOT_FOUND naming it (and the known tables).
  virtual absl::StatusOr<int> FindTable(absl::string_view name) const = 0;
  // The cluster's slot count (StoreOptions::num_slots).
  virtual uint32_t num_slots() const = 0;
};

class RowDataPlane : public virtual StoreCatalog {
 public:
  // Writes the weights of `ids` to out (ids.size() x dim floats, in order),
  // creating missing rows with their initial value. Duplicate ids are fine.
  // INVALID_ARGUMENT naming the id when one is outside a fixed table; then
  // no row is created. RESOURCE_EXHAUSTED when a dynamic table is full.
  virtual absl::Status Lookup(int table, absl::Span<const int64_t> ids,
                              float* out) = 0;

  // Checks a gradient push without changing anything: ids distinct and in
  // range, every value finite. INVALID_ARGUMENT names the table, the id and
  // what is wrong.
  virtual absl::Status ValidateGradients(int table,
                                         absl::Span<const int64_t> ids,
                                         const float* grads) const = 0;

  // Applies one gradient row per id (ids.size() x dim floats) with the
  // table's fused optimizer; rows that do not exist yet are created first.
  // REQUIRES: ValidateGradients(table, ids, grads) is OK.
  virtual absl::Status ApplyGradients(int table, absl::Span<const int64_t> ids,
                                      const float* grads) = 0;

  // Copies the whole stored rows (weights and optimizer state,
  // FusedRowStride floats each) of `ids` to out; NOT_FOUND naming the first
  // id that has no row. For tests, checkpoints and migration.
  virtual absl::Status ReadRows(int table, absl::Span<const int64_t> ids,
                                float* out) const = 0;

  virtual TableInfo Info(int table) const = 0;
};

// ---- Slot transfer: the base of checkpoints and slot migration. ----
// Rows move as (id, fused row) pairs in the layout of ReadRows
// (FusedRowStride floats), so any store can read what another wrote.
class SlotTransfer : public virtual StoreCatalog {
 public:
  // Rows stored per slot, summed over tables (num_slots entries).
  virtual std::vector<int64_t> RowsPerSlot() const = 0;
  // Bytes of row storage per slot (rows x padded row bytes, summed over
  // tables; num_slots entries): what moving the slot copies.
  virtual std::vector<int64_t> BytesPerSlot() const = 0;
  // Sets `out` to the rows of `slot` in `table` whose id is greater than the
  // cursor's (all ids when !cursor->started), the smallest max_rows of them,
  // in ascending id order, and advances the cursor past the last one;
  // cursor->done once no larger id is left. Call again with the same cursor
  // until done. Each call holds the slot's lock (the reader side: lookups go
  // on, pushes to this slot wait) only for itself and scans the slot's whole
  // index, so its cost is O(rows in the slot + max_rows * row bytes).
  // Concurrent writes: each row is copied whole, between two updates, never
  // half-applied. A row created or updated after its chunk was taken is not
  // seen again: rows created with an id below the cursor during an export
  // are missed (a migration forwards those writes; a checkpoint taken while
  // training runs is fuzzy per row, exact per chunk). INVALID_ARGUMENT for a
  // slot >= num_slots or max_rows < 1; NOT_FOUND for an unknown table.
  virtual absl::Status ExportSlot(int table, uint32_t slot, SlotCursor* cursor,
                                  int64_t max_rows, SlotChunk* out) const = 0;

  // Stores `rows` (ids.size() x FusedRowStride floats, as ExportSlot gives
  // them) under `ids`, creating rows that do not exist and overwriting
  // those that do (weights and optimizer state; padding is stored as 0).
  // Everything is checked before anything changes: INVALID_ARGUMENT naming
  // the table, the id, its position and what is wrong when an id is outside
  // a fixed table, does not hash to `slot`, appears twice, or its row holds
  // a non-finite value or a negative second moment (Adagrad's and row-wise
  // Adagrad's sum of squares, Adam's v); RESOURCE_EXHAUSTED when the new
  // rows do not fit in the table. The rows are written in one hold of the
  // slot's lock, so a Lookup sees all of them or none.
  virtual absl::Status ImportRows(int table, uint32_t slot,
                                  absl::Span<const int64_t> ids,
                                  const float* rows) = 0;

  // DropSlot's `table` for every table of the store.
  static constexpr int kAllTables = -1;
  // Removes every row of `slot` from `table` (or from every table, one
  // after the other) and gives their memory back to the system; returns the
  // rows removed. Ids of
  // the slot looked up later start again from their initial value. Blocks
  // the table's lookups and pushes while it compacts (moves the last rows
  // into the freed places), about a memcpy of the dropped bytes.
  // INVALID_ARGUMENT for a slot >= num_slots, NOT_FOUND for an unknown
  // table.
  virtual absl::StatusOr<int64_t> DropSlot(int table, uint32_t slot) = 0;
  // Commits now the memory of fixed table `table`'s first `rows` rows, as
  // StoreOptions::prefault_fixed_share does at creation, sized to the share
  // of its ids a shard map gives this server (a planned map gives servers
  // uneven shares of a table). Never gives memory back; contents are
  // unchanged, rows are still created on first use. Runs on the calling
  // thread, beside lookups and pushes. A store that allocates its rows
  // whole at creation (the GPU store) has nothing to do.
  virtual void CommitFixedRows(int table, int64_t rows) = 0;

  // Marks: what changed since a point, without a snapshot (moves).
  // Makes every change after the call carry a generation above `mark`, as
  // BeginSnapshot(mark) does, but opens no snapshot (an open one stays open
  // and correct: its cut is below the mark). Cuts and marks share one
  // sequence: INVALID_ARGUMENT when mark is 0 or not above every earlier
  // cut and mark. Holds each table's locks only for the bump.
  virtual absl::Status MarkGeneration(uint64_t mark) = 0;
  // As ExportSlot (live rows, same locking and chunking), but only the rows
  // whose generation is above `since` now: after MarkGeneration(m), a later
  // ExportChangedSlot(since = m) sees every row created or changed after
  // the mark, wherever an export's cursor stood when it changed.
  virtual absl::Status ExportChangedSlot(int table, uint32_t slot,
                                         uint64_t since, SlotCursor* cursor,
                                         int64_t max_rows,
                                         SlotChunk* out) const = 0;
};

// ---- Snapshots and row generations: checkpoints while training runs. ----
class SnapshotSource : public virtual StoreCatalog {
 public:
  // Every row carries the generation of its last change (its creation, a
  // push, an import): one integer per row, stored as the row is written,
  // no allocation. Between snapshots, changes carry generation last_cut+1
  // (1 before the first snapshot).

  // Opens a snapshot at cut `cut`: the rows as they are now stay readable
  // through ExportSnapshotSlot until EndSnapshot, while lookups and pushes
  // go on. A change to a row not changed since the cut first copies the
  // row aside (once per row: copy-on-write), so the cost during the
  // snapshot is one row copy per distinct row touched, and the call itself
  // holds every table's locks only for the generation bump (O(tables x lock
  // stripes), not O(rows)). Changes after the call carry generation cut+1.
  // INVALID_ARGUMENT when cut is 0 or not above every earlier cut;
  // FAILED_PRECONDITION when a snapshot is already open.
  virtual absl::Status BeginSnapshot(uint64_t cut) = 0;
  // As ExportSlot, but the rows as they were at the cut, and only those
  // whose generation at the cut was above `since` (0: every row; the cut of
  // an earlier snapshot: the rows changed since that snapshot). Rows created
  // after the cut are not seen. FAILED_PRECONDITION when no snapshot is
  // open.
  virtual absl::Status ExportSnapshotSlot(int table, uint32_t slot,
                                          uint64_t since, SlotCursor* cursor,
                                          int64_t max_rows,
                                          SlotChunk* out) const = 0;
  // Closes the open snapshot (if any) and frees the rows copied aside.
  virtual void EndSnapshot() = 0;
  // Bytes of rows copied aside for the open snapshot (0 when none).
  virtual int64_t SnapshotBytes() const = 0;
};

// A whole store: every role. The factories below make one; callers keep
// the role they use (a pointer to RowDataPlane, SlotTransfer or
// SnapshotSource).
class EmbeddingStore : public RowDataPlane,
                       public SlotTransfer,
                       public SnapshotSource {};

// The store for options.device: the host store for CPU, the GPU store
// (device_store/device_store.h) for CUDA, after checking that the GPU can
// be used (FAILED_PRECONDITION naming cuda:N and why) and that the store
// fits in its free memory (RESOURCE_EXHAUSTED with the footprint).
absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options);

// A store in host memory: per table, one arena of fused rows (address space
// reserved up front, in huge pages where possible) and a hash index per slot,
// guarded by striped locks. Rows are packed at the arena's start; DropSlot
// compacts them and returns the freed tail pages (madvise MADV_DONTNEED).
// INVALID_ARGUMENT for a bad spec (empty or duplicate name, dim outside
// 1..4096, bad optimizer parameters).
absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateHostEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options);

}  // namespace recps::server

#endif  // RECPS_SERVER_STORE_EMBEDDING_STORE_H_

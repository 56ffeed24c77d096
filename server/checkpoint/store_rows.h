// The store-facing side of row files (library recps_checkpoint): a store's
// rows written to a row file, live or from an open snapshot, and a row
// file's rows imported into a store. The file format itself is row_file.h
// (library recps_checkpoint_format, which links no store).
#ifndef RECPS_SERVER_CHECKPOINT_STORE_ROWS_H_
#define RECPS_SERVER_CHECKPOINT_STORE_ROWS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/thread_pool.h"
#include "recps/v1/checkpoint.pb.h"
#include "server/checkpoint/row_file.h"
#include "server/store/embedding_store.h"

namespace recps::server::checkpoint {

// The layout of every table of `store`, as a checkpoint records it.
std::vector<v1::CheckpointTable> StoreLayout(const StoreCatalog& store);

// OK when every table of `store` that appears in `saved` has the same dim,
// optimizer, row stride and row count; FAILED_PRECONDITION naming `source`
// (a file), the table, the field and both values otherwise. Tables only in
// one of them are not checked here.
absl::Status CheckLayout(
    const google::protobuf::RepeatedPtrField<v1::CheckpointTable>& saved,
    const StoreCatalog& store, absl::string_view source);

// OK when `store` can take the rows of `reader`'s file: same slot count,
// and each table in both has the same layout (CheckLayout).
// FAILED_PRECONDITION naming the file, the table and the field otherwise.
absl::Status CheckRowFileStore(const RowFileReader& reader,
                               const StoreCatalog& store);

// What a row file records besides the rows (RowFileHeader).
struct RowFileMeta {
  std::string job_config_digest;
  uint64_t step = 0;
  v1::CheckpointKind kind = v1::CHECKPOINT_KIND_FULL;
  uint64_t base_step = 0;
};

// Which rows of a store a row file holds.
struct RowSelection {
  // Only these tables (store indices); empty: every table of the store.
  std::vector<int> tables;
  // Only the (table, slot) units for which this is true; empty: every
  // unit of `tables` x the slots given. A shard server's file holds the
  // units it owned at the cut, not the rows a move copied in or keeps
  // until its hand-over is written.
  std::function<bool(int table, uint32_t slot)> unit;
};

// Writes the rows of a store to a new row file.
class RowFileWriter {
 public:
  explicit RowFileWriter(RowFileOptions options = {}) : options_(options) {}

  // Every row of the selected tables of `store` in `slots` (any order,
  // duplicates ignored) to a new file at `path`, synced to disk (fsync)
  // before it returns; then its size and CRC-32C (computed as the file is
  // written). The live rows are read with SlotTransfer::ExportSlot, so a
  // store that trains meanwhile gives a row-wise fuzzy copy. On error the
  // partial file is removed: RESOURCE_EXHAUSTED when the disk is full,
  // PERMISSION_DENIED / NOT_FOUND / FAILED_PRECONDITION naming the path
  // when it cannot be created, INVALID_ARGUMENT for a slot >= the store's
  // slots.
  absl::StatusOr<RowFileInfo> Write(const SlotTransfer& store,
                                    absl::Span<const uint32_t> slots,
                                    const std::string& path,
                                    const RowSelection& selection = {},
                                    const RowFileMeta& meta = {}) const;

  // As Write, from the store's open snapshot (SnapshotSource::
  // BeginSnapshot): exactly the cut's rows, and of them only those whose
  // generation is above `since_generation` (0: all; an increment: the
  // base's cut).
  absl::StatusOr<RowFileInfo> WriteSnapshot(const SnapshotSource& store,
                                            uint64_t since_generation,
                                            absl::Span<const uint32_t> slots,
                                            const std::string& path,
                                            const RowSelection& selection = {},
                                            const RowFileMeta& meta = {}) const;

  // One chunk of a (table, slot) export: SlotTransfer::ExportSlot or
  // SnapshotSource::ExportSnapshotSlot bound to their arguments.
  using ExportChunk = std::function<absl::Status(
      int table, uint32_t slot, SlotCursor* cursor, int64_t max_rows,
      SlotChunk* out)>;

 private:
  // WriteHere on a background thread of its own.
  absl::StatusOr<RowFileInfo> WriteFrom(const StoreCatalog& store,
                                        const ExportChunk& export_chunk,
                                        absl::Span<const uint32_t> slots,
                                        const std::string& path,
                                        const RowSelection& selection,
                                        const RowFileMeta& meta) const;
  absl::StatusOr<RowFileInfo> WriteHere(const StoreCatalog& store,
                                        const ExportChunk& export_chunk,
                                        absl::Span<const uint32_t> slots,
                                        const std::string& path,
                                        const RowSelection& selection,
                                        const RowFileMeta& meta) const;

  RowFileOptions options_;
};

struct ImportOptions {
  // Rows per SlotTransfer::ImportRows call.
  int64_t batch_rows = 4096;
  // Imports slots in parallel when set.
  ThreadPool* pool = nullptr;
};

// Imports the rows of `slots` (any order) of every table of `store` that
// the file holds, batch_rows at a time per slot (SlotTransfer::
// ImportRows, which overwrites rows that exist: later files of a chain
// override earlier ones), on options.pool when given (slots in parallel);
// returns the rows imported. Call CheckRowFileStore first. A store
// refusing a batch (e.g. RESOURCE_EXHAUSTED: the table is full) stops the
// import with the batches before it applied.
absl::StatusOr<int64_t> ImportRowFile(const RowFileReader& reader,
                                      SlotTransfer& store,
                                      absl::Span<const uint32_t> slots,
                                      const ImportOptions& options = {});
// The same with a slot list per table of the store (slots_by_table[t] for
// store table t; a table past the end imports nothing): for shard maps
// that route some tables by their own slot owners.
absl::StatusOr<int64_t> ImportRowFile(
    const RowFileReader& reader, SlotTransfer& store,
    absl::Span<const std::vector<uint32_t>> slots_by_table,
    const ImportOptions& options = {});

// Imports the rows of `readers` (a chain's files, oldest first; opened
// with RowFileReader::Verify::kLater) as ImportRowFile does, while a thread
// of its own checks each file's whole size and CRC-32C (VerifyWhole), so
// that the file is read from disk once and the check adds no pass of its
// own. `store` must hold no row in the restored slots (RestoreChain checks
// it): when a check or an import fails, those slots are dropped again,
// leaving the store as it was, and the error is returned (a file's failed
// check before an import error that its damage may have caused). Returns
// the rows imported.
absl::StatusOr<int64_t> ImportRowFilesVerified(
    absl::Span<const RowFileReader* const> readers, SlotTransfer& store,
    absl::Span<const std::vector<uint32_t>> slots_by_table,
    const ImportOptions& options = {});

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_STORE_ROWS_H_

// Row files: the rows of one shard server in one RocksDB SST file, keyed by
// (table, slot, id) so that a restore onto any shard map reads back exactly
// the slots a server owns now.
//
// Key: the table name, a 0 byte, the slot as big-endian uint32, the id as
// big-endian uint64 with the sign bit flipped: byte order == (table name,
// slot, id) order, so one slot of one table is a contiguous key range.
// Value: the fused row (kernels::FusedRowStride floats: weights, optimizer
// state, padding) as little-endian float32, as EmbeddingStore::ExportSlot
// gives it. The first key, "\0recps.row_file", holds a v1::RowFileHeader
// (slot count, the tables' layouts). Layout: docs/operations.md.
#ifndef RECPS_SERVER_CHECKPOINT_ROW_FILE_H_
#define RECPS_SERVER_CHECKPOINT_ROW_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/thread_pool.h"
#include "recps/v1/checkpoint.pb.h"
#include "server/shard/embedding_store.h"

namespace rocksdb {
class SstFileReader;
}

namespace recps::server::checkpoint {

// Version of the row file's key and value encoding.
inline constexpr uint32_t kRowFileFormatVersion = 1;

// The key of (table, slot, id), appended to *out (cleared first).
void EncodeRowKey(absl::string_view table, uint32_t slot, int64_t id,
                  std::string* out);

// The layout of every table of `store`, as a checkpoint records it.
std::vector<v1::CheckpointTable> StoreLayout(const EmbeddingStore& store);

// OK when every table of `store` that appears in `saved` has the same dim,
// optimizer, row stride and row count; FAILED_PRECONDITION naming `source`
// (a file), the table, the field and both values otherwise. Tables only in
// one of them are not checked here.
absl::Status CheckLayout(
    const google::protobuf::RepeatedPtrField<v1::CheckpointTable>& saved,
                         const EmbeddingStore& store,
                         absl::string_view source);

struct RowFileInfo {
  std::string path;
  uint64_t size_bytes = 0;
  uint32_t crc32c = 0;  // of the whole file
  int64_t rows = 0;
};

struct RowFileOptions {
  // Rows per ExportSlot call (one hold of the slot's lock each).
  int64_t chunk_rows = 4096;
  // SST data block size: rows are large, big blocks keep the index small.
  size_t block_size = size_t{64} << 10;
  // The file is written by a thread of its own in buffers of this size
  // (two of them: one filling, one being written; at least 1 MiB), and
  // write-back (sync_file_range) starts after each.
  size_t write_buffer_bytes = size_t{8} << 20;
};

// Writes the rows of a store to a new row file.
class RowFileWriter {
 public:
  explicit RowFileWriter(RowFileOptions options = {}) : options_(options) {}

  // Every row of every table of `store` in `slots` (any order, duplicates
  // ignored) to a new file at `path`, synced to disk (fsync) before it
  // returns; then its size and CRC-32C (computed as the file is written). Rows are read with ExportSlot, so a
  // store that trains meanwhile gives a row-wise fuzzy copy. On error the
  // partial file is removed: RESOURCE_EXHAUSTED when the disk is full,
  // PERMISSION_DENIED / NOT_FOUND / FAILED_PRECONDITION naming the path when
  // it cannot be created, INVALID_ARGUMENT for a slot >= the store's slots.
  absl::StatusOr<RowFileInfo> Write(const EmbeddingStore& store,
                                    absl::Span<const uint32_t> slots,
                                    const std::string& path) const;

 private:
  RowFileOptions options_;
};

struct ImportOptions {
  // Rows per EmbeddingStore::ImportRows call.
  int64_t batch_rows = 4096;
  // Imports slots in parallel when set.
  ThreadPool* pool = nullptr;
};

// Reads a row file back into a store, by slot.
class RowFileReader {
 public:
  ~RowFileReader();
  RowFileReader(const RowFileReader&) = delete;
  RowFileReader& operator=(const RowFileReader&) = delete;

  // Checks the file's size and CRC-32C against the expected ones (from the
  // manifest) before opening it: DATA_LOSS naming the file and both values
  // for a truncated or corrupted file; NOT_FOUND when it is missing. Then
  // opens it and reads its header (DATA_LOSS when absent or unreadable,
  // FAILED_PRECONDITION for an unknown format version).
  static absl::StatusOr<std::unique_ptr<RowFileReader>> Open(
      const std::string& path, uint64_t expected_size,
      uint32_t expected_crc32c);

  const std::string& path() const { return path_; }
  const v1::RowFileHeader& header() const { return header_; }

  // OK when `store` can take this file's rows: same slot count, and each
  // table in both has the same layout (CheckLayout). FAILED_PRECONDITION
  // naming the file, the table and the field otherwise.
  absl::Status CheckStore(const EmbeddingStore& store) const;

  // Imports the rows of `slots` (any order) of every table of `store` that
  // the file holds, batch_rows at a time per slot (EmbeddingStore::
  // ImportRows), on options.pool when given (slots in parallel); returns the
  // rows imported. Call CheckStore first. A store refusing a batch (e.g.
  // RESOURCE_EXHAUSTED: the table is full) stops the import with the
  // batches before it applied.
  absl::StatusOr<int64_t> Import(EmbeddingStore& store,
                                 absl::Span<const uint32_t> slots,
                                 const ImportOptions& options = {}) const;

 private:
  RowFileReader() = default;
  // Import of `sorted` slots on the calling thread.
  absl::StatusOr<int64_t> ImportSlots(EmbeddingStore& store,
                                      absl::Span<const uint32_t> sorted,
                                      int64_t batch_rows) const;

  std::string path_;
  std::unique_ptr<rocksdb::SstFileReader> reader_;
  v1::RowFileHeader header_;
};

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_ROW_FILE_H_

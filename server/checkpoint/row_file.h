// Row files (checkpoint format library, no store): the rows of one shard
// server in one RocksDB SST file, keyed by (table, slot, id) so that a
// restore onto any shard map reads back exactly the slots a server owns now.
//
// Key: the table name, a 0 byte, the slot as big-endian uint32, the id as
// big-endian uint64 with the sign bit flipped: byte order == (table name,
// slot, id) order, so one slot of one table is a contiguous key range.
// Value: the fused row (CheckpointTable.row_stride floats: weights,
// optimizer state, padding) as little-endian float32, as
// SlotTransfer::ExportSlot gives it. The first key, "\0recps.row_file",
// holds a v1::RowFileHeader (slot count, the tables' layouts, digest, step).
// Layout: docs/operations.md. The store-facing side (writing a store's rows,
// importing into a store) is server/checkpoint/store_rows.h.
#ifndef RECPS_SERVER_CHECKPOINT_ROW_FILE_H_
#define RECPS_SERVER_CHECKPOINT_ROW_FILE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/thread_pool.h"
#include "recps/v1/checkpoint.pb.h"

namespace rocksdb {
class Iterator;
class SstFileReader;
class SstFileWriter;
class Env;
}  // namespace rocksdb

namespace recps::server::checkpoint {

// Version of the row file's key and value encoding.
inline constexpr uint32_t kRowFileFormatVersion = 1;

// The key of (table, slot, id), appended to *out (cleared first).
void EncodeRowKey(absl::string_view table, uint32_t slot, int64_t id,
                  std::string* out);
// The key prefix of one (table, slot): every key of its rows starts with it.
void EncodeSlotPrefix(absl::string_view table, uint32_t slot,
                      std::string* out);
// The parts of a row key; false when `key` is not one (e.g. the header).
bool DecodeRowKey(absl::string_view key, absl::string_view* table,
                  uint32_t* slot, int64_t* id);

struct RowFileInfo {
  std::string path;
  uint64_t size_bytes = 0;
  uint32_t crc32c = 0;  // of the whole file
  int64_t rows = 0;
};

struct RowFileOptions {
  // Rows per SlotTransfer::ExportSlot call (one hold of the slot's lock
  // each) when a store's rows are written (store_rows.h).
  int64_t chunk_rows = 4096;
  // SST data block size: rows are large, big blocks keep the index small.
  size_t block_size = size_t{256} << 10;
  // The file is written by a thread of its own in buffers of this size
  // (two of them: one filling, one being written; at least 1 MiB), and
  // write-back (sync_file_range) starts after each.
  size_t write_buffer_bytes = size_t{8} << 20;
  // The writer's threads (the file's I/O thread, and in RowFileWriter the
  // export and encoding threads) run as SCHED_BATCH, so that their wakeups
  // do not preempt the store's request threads, with this much niceness
  // added (setpriority). A large value starves the write while requests
  // keep the cores busy (the snapshot then stays open, and copies aside,
  // for longer): measured, nice 10 made a 2 s write take 50 s under a
  // busy push loop on 2 cores.
  int thread_nice = 0;
  // When set, counts the rows added so far (progress of a long write).
  std::atomic<int64_t>* rows_written = nullptr;
};

// Builds a new row file from rows given in key order. Not thread-safe.
class RowFileBuilder {
 public:
  // Creates `path` (which must not exist as a complete file the caller
  // cares about: it is overwritten) and writes the header entry. Errors
  // name the path: PERMISSION_DENIED / NOT_FOUND / FAILED_PRECONDITION when
  // it cannot be created, RESOURCE_EXHAUSTED when the disk is full,
  // INVALID_ARGUMENT for a table name holding a 0 byte.
  static absl::StatusOr<std::unique_ptr<RowFileBuilder>> Create(
      const std::string& path, const v1::RowFileHeader& header,
      const RowFileOptions& options = {});
  // Removes the file unless Finish succeeded.
  ~RowFileBuilder();
  RowFileBuilder(const RowFileBuilder&) = delete;
  RowFileBuilder& operator=(const RowFileBuilder&) = delete;

  // Rows of (table, slot): ids ascending, rows ids.size() x stride floats;
  // every key after every key added before (tables by name, then slot,
  // then id), else INVALID_ARGUMENT from RocksDB naming the file.
  absl::Status Add(absl::string_view table, uint32_t slot,
                   absl::Span<const int64_t> ids, const float* rows,
                   int64_t stride);
  // One entry as a RowFileReader iterator gives it (a merge's output).
  absl::Status AddEncoded(absl::string_view key, absl::string_view value);

  int64_t rows() const { return rows_; }
  const std::string& path() const { return path_; }

  // Writes the index and footer, syncs the file (fsync) and returns its
  // size and CRC-32C (computed while it was written, no second pass).
  absl::StatusOr<RowFileInfo> Finish();

 private:
  struct Crc;
  RowFileBuilder() = default;

  std::string path_;
  std::unique_ptr<Crc> crc_;
  std::unique_ptr<rocksdb::Env> env_;
  std::unique_ptr<rocksdb::SstFileWriter> writer_;
  std::string key_;
  int64_t rows_ = 0;
  std::atomic<int64_t>* progress_ = nullptr;
  bool finished_ = false;
};

// Reads a row file. Thread-safe after Open (each call uses its own
// iterator).
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
  // With a pool, the CRC pass reads the file in parallel ranges.
  // Verify::kLater checks the size only (stat) and leaves the CRC pass to
  // VerifyWhole, for a caller that overlaps it with reading the rows and
  // undoes what it read when the check fails (ImportRowFilesVerified).
  enum class Verify { kBeforeOpen, kLater };
  static absl::StatusOr<std::unique_ptr<RowFileReader>> Open(
      const std::string& path, uint64_t expected_size,
      uint32_t expected_crc32c, ThreadPool* pool = nullptr,
      Verify verify = Verify::kBeforeOpen);

  // The whole-file size and CRC-32C check against the values given to
  // Open, with Open's errors. Reads the whole file (one thread, or ranges
  // in parallel on `pool`).
  absl::Status VerifyWhole(ThreadPool* pool = nullptr) const;

  const std::string& path() const { return path_; }
  const v1::RowFileHeader& header() const { return header_; }
  // The header's layout of `table`, or null when the file has none.
  const v1::CheckpointTable* FindTable(absl::string_view table) const;

  // Rows of one (table, slot) batch: ids ascending, rows ids.size() x
  // row_stride floats. Returning an error stops the read with it.
  using RowsFn = std::function<absl::Status(
      uint32_t slot, absl::Span<const int64_t> ids, const float* rows)>;
  // Calls fn for the rows of `table` in `sorted_slots` (ascending),
  // batch_rows at most per call, in key order. DATA_LOSS naming the file
  // for an entry of the wrong size. A table the file lacks reads as empty.
  absl::Status ReadSlots(const v1::CheckpointTable& table,
                         absl::Span<const uint32_t> sorted_slots,
                         int64_t batch_rows, const RowsFn& fn) const;

  // An iterator over the row entries in key order (the header skipped):
  // for merges (compaction, export). Check status() when !Valid().
  std::unique_ptr<rocksdb::Iterator> NewRowIterator() const;

 private:
  RowFileReader() = default;
  // Opens the SST file at path_ and reads its header.
  absl::Status OpenTable();

  std::string path_;
  uint64_t expected_size_ = 0;
  uint32_t expected_crc32c_ = 0;
  std::unique_ptr<rocksdb::SstFileReader> reader_;
  v1::RowFileHeader header_;
};

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_ROW_FILE_H_

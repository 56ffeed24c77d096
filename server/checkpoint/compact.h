// Compaction (format library): folds a chain (a full checkpoint and its
// increments) into one full checkpoint at the same step, in the same
// directory, atomically.
#ifndef RECPS_SERVER_CHECKPOINT_COMPACT_H_
#define RECPS_SERVER_CHECKPOINT_COMPACT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "server/checkpoint/manifest.h"
#include "server/checkpoint/row_file.h"

namespace recps::server::checkpoint {

struct CompactOptions {
  RowFileOptions file;
  // The listing, the manifest swap, the directory fsyncs and the removal of
  // superseded files go through it; the row files are read and written by
  // RocksDB through its own rocksdb::Env. Must outlive the call.
  FileSystem* fs = FileSystem::Default();
  // Called now and then with the rows written so far and the rows read
  // (entries of every file of the chain, the upper bound of the output).
  std::function<void(int64_t rows_written, int64_t rows_in_chain)> progress;
};

struct CompactResult {
  CheckpointInfo checkpoint;  // the new full manifest
  int chain_length = 0;       // checkpoints folded (1: it was already full)
  int64_t rows = 0;           // rows in the new files
  uint64_t bytes = 0;         // bytes of the new files
  std::vector<std::string> removed_files;  // superseded files deleted
};

// Compacts the checkpoint at `step` (the newest complete one when unset)
// under `root`: every row file of its chain is checked (size, CRC-32C)
// and merged by key (the newest checkpoint's entry of a key wins) into new
// row files under new names in the checkpoint's directory, split by slot
// range into as many files as it has; they are fsynced, then its MANIFEST
// is replaced atomically by one of kind FULL (same step, digest, shard
// map, tables, dense state, worker positions, reason; base_step and
// full_step 0), and only then are the checkpoint's superseded files
// removed. An interruption before the manifest swap leaves the old valid
// chain (plus unreferenced new files, removed by the next compaction);
// after it, a valid full checkpoint. Checkpoints older than it are not
// touched (PruneCheckpoints removes them once nothing needs them). A full
// checkpoint is left as it is (chain_length 1). Errors as ResolveChain and
// RowFileReader::Open, and the write errors of RowFileBuilder, naming files.
absl::StatusOr<CompactResult> CompactChain(
    const std::string& root, std::optional<uint64_t> step,
    const CompactOptions& options = {});

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_COMPACT_H_

// Writing and restoring a whole checkpoint in one process (library
// recps_checkpoint, store-facing): WriteCheckpoint for tests and tools,
// RestoreChain for the shard server's RestoreRows. Each shard server's rows go
// to one row file; the manifest is written last.
#ifndef RECPS_SERVER_CHECKPOINT_CHECKPOINT_H_
#define RECPS_SERVER_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/file_system.h"
#include "recps/v1/shard_map.pb.h"
#include "server/checkpoint/manifest.h"
#include "server/checkpoint/row_file.h"
#include "server/checkpoint/store_rows.h"
#include "server/store/embedding_store.h"

namespace recps::server::checkpoint {

// The rows of one shard server: its store and the slots it owns.
struct ShardRows {
  const SlotTransfer* store = nullptr;
  std::vector<uint32_t> slots;
};

struct CheckpointSpec {
  uint64_t step = 0;
  std::string job_config_digest;  // JobConfigDigest(job)
  v1::ShardMap shard_map;         // the map at the cut
};

// Writes <root>/step-<step>/: one row file "shard-NNNNN.sst" per entry of
// `shards` (in order), a directory fsync, then the manifest. Creates root
// when missing. ALREADY_EXISTS when that step is already complete; a
// partial directory of the same step is replaced. On any error the new
// directory is removed (best effort) and nothing else is touched; it is
// never listed since it has no manifest. Errors name the path:
// RESOURCE_EXHAUSTED (disk full), PERMISSION_DENIED, FAILED_PRECONDITION
// (root is not a directory), INVALID_ARGUMENT (no shards, a null store,
// stores disagreeing on a table's layout or the slot count).
// The directories, their fsyncs, the removals and the manifest go through
// `fs`; the row files are RocksDB's SST files, written through its own
// rocksdb::Env (row_file.h), whatever `fs` is.
absl::StatusOr<CheckpointInfo> WriteCheckpoint(
    const std::string& root, const CheckpointSpec& spec,
    absl::Span<const ShardRows> shards, const RowFileOptions& options = {},
    FileSystem* fs = FileSystem::Default());

struct RestoreStats {
  int64_t rows = 0;   // rows imported into the store
  int files = 0;      // row files read
  uint64_t bytes = 0; // bytes of the row files (each read whole for its CRC)
};

// Imports into `store` the rows of `slots` (the slots this server owns in
// the current shard map, whatever the map was at save time) from every row
// file of the checkpoint in `checkpoint_dir`. Checked before any row is
// imported: the manifest (NOT_FOUND when missing), the job digest
// (FAILED_PRECONDITION naming both digests: a checkpoint of another job),
// the slot count and table layouts (FAILED_PRECONDITION naming the table
// and field; every table of the store must be in the checkpoint), the size
// of every row file, and that the store holds no row in `slots` yet
// (FAILED_PRECONDITION: restore into a fresh store). Checked while the rows
// are imported, on a thread of its own: the CRC-32C of every row file
// (DATA_LOSS naming the file); a failed check, like a failed import, drops
// the restored slots again, so a failed restore leaves no row behind. An
// empty expected_digest skips the digest check.
// options.pool imports slots in parallel. Manifests are read through `fs`,
// row files through RocksDB.
absl::StatusOr<RestoreStats> RestoreCheckpoint(
    const std::string& checkpoint_dir, absl::string_view expected_digest,
    SlotTransfer& store, absl::Span<const uint32_t> slots,
    const ImportOptions& options = {}, FileSystem* fs = FileSystem::Default());

// RestoreCheckpoint over a chain (`dirs` oldest first: a full checkpoint,
// then increments whose base_step is the previous one's step; later files
// override earlier ones), with the slots to import per store table
// (slots_by_table[t]; the one-list form imports `slots` of every table).
// All checks of RestoreCheckpoint are made on every checkpoint of the
// chain, and the chain's links (FAILED_PRECONDITION naming both
// directories), before any row is imported. INVALID_ARGUMENT for an empty
// chain.
absl::StatusOr<RestoreStats> RestoreChain(
    absl::Span<const std::string> dirs, absl::string_view expected_digest,
    SlotTransfer& store,
    absl::Span<const std::vector<uint32_t>> slots_by_table,
    const ImportOptions& options = {}, FileSystem* fs = FileSystem::Default());

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_CHECKPOINT_H_

// What the coordinator writes into a checkpoint besides the shard servers'
// row files: the tables as the servers store them, the dense state file
// (the workers' dense parameters and optimizer state, rank 0's copy), and
// the manifest, written last, that makes the checkpoint complete
// (docs/operations.md). Pure functions over the job, the map and the files:
// no RPCs, no locks.
#ifndef RECPS_SERVER_COORDINATOR_CHECKPOINT_CONTENTS_H_
#define RECPS_SERVER_COORDINATOR_CHECKPOINT_CONTENTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "recps/v1/checkpoint.pb.h"
#include "recps/v1/job.pb.h"
#include "recps/v1/shard_map.pb.h"

namespace recps::server {

// The dense state file's name in a checkpoint's directory.
inline constexpr char kDenseStateFileName[] = "dense.pb";

// `dir`/`name` (no second slash when `dir` ends in one).
std::string JoinPath(const std::string& dir, const std::string& name);

// The table layouts the servers' stores have: the job's tables and, for a
// table split column-wise in `map`, each column group as a table of its own
// (the names the servers store them under). INVALID_ARGUMENT for a bad map
// or table config.
absl::StatusOr<std::vector<v1::CheckpointTable>> ManifestTables(
    const v1::JobConfig& job, const v1::ShardMap& map);

// Writes `dense_state` atomically through `fs` as `step_dir`/dense.pb and
// returns its manifest entry; nullopt (and no file) when it is empty.
absl::StatusOr<std::optional<v1::CheckpointFile>> WriteDenseState(
    const std::string& step_dir, const std::string& dense_state,
    FileSystem* fs);

// What a checkpoint's manifest records besides its tables and files.
struct ManifestParts {
  uint64_t step = 0;
  std::string job_config_digest;
  v1::ShardMap map;  // the map the snapshots were taken under
  bool incremental = false;
  uint64_t base_step = 0;  // incremental only
  uint64_t full_step = 0;  // incremental only
  std::string reason;
  absl::Time created;
};

// The manifest of a checkpoint: `parts`, the tables of `job` under
// parts.map (ManifestTables' errors), the servers' row files, the dense
// state file (if any) and the workers' data positions, in rank order.
absl::StatusOr<v1::CheckpointManifest> MakeManifest(
    const ManifestParts& parts, const v1::JobConfig& job,
    std::vector<v1::CheckpointFile> files,
    const std::optional<v1::CheckpointFile>& dense,
    const std::vector<v1::WorkerPosition>& workers);

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_CHECKPOINT_CONTENTS_H_

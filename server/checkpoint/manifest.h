// Checkpoint directories and their manifests.
//
// A checkpoint is the directory <root>/step-<step, 12+ digits>/ holding its
// row files (row_file.h) and MANIFEST, written last and atomically (temp
// file, fdatasync, rename, fsync of the directory). A directory without a
// valid MANIFEST is partial: never listed, never restored, pruned once a
// newer checkpoint is complete. Layout and guarantees: docs/operations.md.
//
// Every function here reaches the disk through `fs` (default: the POSIX
// one), which must outlive the call; tests pass a faulty one.
#ifndef RECPS_SERVER_CHECKPOINT_MANIFEST_H_
#define RECPS_SERVER_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "recps/v1/checkpoint.pb.h"
#include "recps/v1/job.pb.h"

namespace recps::server::checkpoint {

// Version of the manifest file; a reader refuses others.
inline constexpr uint32_t kManifestFormatVersion = 1;
inline constexpr char kManifestName[] = "MANIFEST";
// Manifests are small (the shard map dominates); anything larger is not one.
inline constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;

// A stable digest of a job config: 16 hex digits of FNV-1a 64 (mixed,
// common/hashing.h StableNameKey) over its deterministic serialization. Two
// configs with the same fields give the same digest. training.steps, the
// eval settings (eval_interval, eval_batches, criteo eval_paths) and
// training.checkpoint are left out, so a resumed run may train longer,
// evaluate differently or checkpoint elsewhere.
std::string JobConfigDigest(const v1::JobConfig& job);

// "step-" and the step padded to 12 digits.
std::string CheckpointDirName(uint64_t step);

// Writes `manifest` as <checkpoint_dir>/MANIFEST atomically: the file's
// magic, the serialized manifest and its CRC-32C. Errors name the file;
// on one, no MANIFEST (nor temp file) is left where there was none.
absl::Status WriteManifest(const std::string& checkpoint_dir,
                           const v1::CheckpointManifest& manifest,
                           FileSystem* fs = FileSystem::Default());

// Reads and checks <checkpoint_dir>/MANIFEST: NOT_FOUND naming it when
// missing ("not a complete checkpoint"), DATA_LOSS when its magic, length or
// CRC is wrong, FAILED_PRECONDITION for another format version.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(
    const std::string& checkpoint_dir, FileSystem* fs = FileSystem::Default());

struct CheckpointInfo {
  uint64_t step = 0;
  std::string dir;  // <root>/step-...
  v1::CheckpointManifest manifest;
};

// The complete checkpoints under `root` (a valid manifest whose step
// matches the directory's name), oldest first. Partial directories and
// other entries are skipped. NOT_FOUND when root does not exist,
// FAILED_PRECONDITION when it is not a directory, PERMISSION_DENIED /
// UNAVAILABLE when it cannot be read; each names it.
absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(
    const std::string& root, FileSystem* fs = FileSystem::Default());

// Removes all complete checkpoints but the newest keep_last (>= 1, else
// INVALID_ARGUMENT) and every checkpoint their chains need (the bases of a
// kept increment, down to its full checkpoint: chain.h), and the partial
// step directories older than the newest complete one (a newer partial one
// may be in progress). The newest complete checkpoint is never removed. A
// checkpoint loses its manifest first, so an interrupted prune leaves a
// partial directory, never a damaged complete one. Returns the directories
// removed.
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(
    const std::string& root, int keep_last,
    FileSystem* fs = FileSystem::Default());

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_MANIFEST_H_

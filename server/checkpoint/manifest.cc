#include "server/checkpoint/manifest.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/checkpoint/crc32c.h"

namespace recps::server::checkpoint {
namespace {

// File = magic (8 bytes), serialized manifest, CRC-32C of it (4 bytes LE).
constexpr char kMagic[] = "RECPSCK1";
constexpr size_t kMagicBytes = 8;

constexpr char kStepPrefix[] = "step-";

// The step of a directory named "step-<digits>"; false for other names.
bool ParseStepDir(const std::string& name, uint64_t* step) {
  if (!absl::StartsWith(name, kStepPrefix)) return false;
  const std::string digits = name.substr(sizeof(kStepPrefix) - 1);
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  return absl::SimpleAtoi(digits, step);
}

struct StepDir {
  uint64_t step = 0;
  std::string dir;
  bool complete = false;
  v1::CheckpointManifest manifest;
};

absl::StatusOr<std::vector<StepDir>> ScanRoot(const std::string& root,
                                              FileSystem* fs) {
  ASSIGN_OR_RETURN(const std::vector<FileSystem::DirEntry> entries,
                   fs->ListDir(root));
  std::vector<StepDir> out;
  for (const FileSystem::DirEntry& e : entries) {
    StepDir d;
    if (!e.is_dir || !ParseStepDir(e.name, &d.step)) continue;
    d.dir = absl::StrCat(root, "/", e.name);
    absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(d.dir, fs);
    if (manifest.ok() && manifest->step() == d.step) {
      d.complete = true;
      d.manifest = *std::move(manifest);
    }
    out.push_back(std::move(d));
  }
  std::sort(out.begin(), out.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

absl::Status RemoveCheckpointDir(const std::string& dir, FileSystem* fs) {
  // The manifest first: from then on the directory is partial.
  const absl::Status status =
      fs->RemoveFile(absl::StrCat(dir, "/", kManifestName));
  if (!status.ok() && !absl::IsNotFound(status)) return status;
  return fs->RemoveTree(dir);
}

}  // namespace

std::string JobConfigDigest(const v1::JobConfig& job) {
  // What a resumed run may change without changing the trained state: how
  // long it trains, how it evaluates, where and how often it checkpoints.
  v1::JobConfig trained = job;
  v1::TrainingConfig* training = trained.mutable_training();
  training->clear_steps();
  training->clear_eval_interval();
  training->clear_eval_batches();
  training->clear_checkpoint();
  if (trained.data().has_criteo()) {
    trained.mutable_data()->mutable_criteo()->clear_eval_paths();
  }
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    trained.SerializeToCodedStream(&coded);
  }
  return absl::StrFormat("%016x", StableNameKey(bytes));
}

std::string CheckpointDirName(uint64_t step) {
  return absl::StrFormat("%s%012u", kStepPrefix, step);
}

absl::Status WriteManifest(const std::string& checkpoint_dir,
                           const v1::CheckpointManifest& manifest,
                           FileSystem* fs) {
  std::string payload;
  if (!manifest.SerializeToString(&payload)) {
    return absl::InternalError("cannot serialize the checkpoint manifest");
  }
  std::string bytes(kMagic, kMagicBytes);
  bytes += payload;
  const uint32_t crc = Crc32cExtend(0, payload.data(), payload.size());
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(crc >> (8 * i)));
  return fs->WriteFileAtomically(
      absl::StrCat(checkpoint_dir, "/", kManifestName), bytes);
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(
    const std::string& checkpoint_dir, FileSystem* fs) {
  const std::string path = absl::StrCat(checkpoint_dir, "/", kManifestName);
  absl::StatusOr<std::string> bytes = fs->ReadSmallFile(path, kMaxManifestBytes);
  if (absl::IsNotFound(bytes.status())) {
    return absl::NotFoundError(absl::StrCat(
        "checkpoint manifest ", path,
        " does not exist: not a complete checkpoint (a write that did not "
        "finish leaves no manifest)"));
  }
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() < kMagicBytes + 4 ||
      std::memcmp(bytes->data(), kMagic, kMagicBytes) != 0) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint manifest ", path, " (", bytes->size(),
        " bytes) does not start with the manifest magic: not a manifest or "
        "truncated"));
  }
  const absl::string_view payload(bytes->data() + kMagicBytes,
                                  bytes->size() - kMagicBytes - 4);
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= uint32_t{static_cast<uint8_t>((*bytes)[bytes->size() - 4 + i])}
              << (8 * i);
  }
  if (Crc32cExtend(0, payload.data(), payload.size()) != stored) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path,
                                            " fails its CRC-32C: corrupted"));
  }
  v1::CheckpointManifest manifest;
  if (!manifest.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", path, " cannot be parsed"));
  }
  if (manifest.format_version() != kManifestFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint manifest ", path, " has format version ",
        manifest.format_version(), "; this build reads version ",
        kManifestFormatVersion));
  }
  return manifest;
}

absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(
    const std::string& root, FileSystem* fs) {
  ASSIGN_OR_RETURN(std::vector<StepDir> dirs, ScanRoot(root, fs));
  std::vector<CheckpointInfo> out;
  for (StepDir& d : dirs) {
    if (!d.complete) continue;
    out.push_back({d.step, std::move(d.dir), std::move(d.manifest)});
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(
    const std::string& root, int keep_last, FileSystem* fs) {
  if (keep_last < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keep_last is ", keep_last,
        "; it must be at least 1 (the newest complete checkpoint is kept)"));
  }
  ASSIGN_OR_RETURN(const std::vector<StepDir> dirs, ScanRoot(root, fs));
  int complete = 0;
  uint64_t newest_complete = 0;
  bool any_complete = false;
  absl::flat_hash_map<uint64_t, const StepDir*> by_step;
  for (const StepDir& d : dirs) {
    if (!d.complete) continue;
    ++complete;
    newest_complete = d.step;
    any_complete = true;
    by_step[d.step] = &d;
  }
  // The newest keep_last, and every checkpoint their chains need.
  absl::flat_hash_set<uint64_t> keep;
  int complete_seen = 0;
  for (const StepDir& d : dirs) {
    if (!d.complete) continue;
    ++complete_seen;
    if (complete - complete_seen >= keep_last) continue;
    const StepDir* cur = &d;
    while (cur != nullptr && keep.insert(cur->step).second &&
           cur->manifest.kind() == v1::CHECKPOINT_KIND_INCREMENTAL) {
      auto it = by_step.find(cur->manifest.base_step());
      cur = it == by_step.end() ? nullptr : it->second;
    }
  }
  std::vector<std::string> removed;
  for (const StepDir& d : dirs) {
    const bool remove = d.complete
                            ? !keep.contains(d.step)
                            : any_complete && d.step < newest_complete;
    if (!remove) continue;
    RETURN_IF_ERROR(RemoveCheckpointDir(d.dir, fs));
    removed.push_back(d.dir);
  }
  if (!removed.empty()) RETURN_IF_ERROR(fs->SyncDir(root));
  return removed;
}

}  // namespace recps::server::checkpoint

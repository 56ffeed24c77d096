#include "server/checkpoint/checkpoint.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace recps::server::checkpoint {
namespace {

// Every table layout of all shards, once; stores must agree.
absl::StatusOr<std::vector<v1::CheckpointTable>> MergedLayout(
    absl::Span<const ShardRows> shards, uint32_t* num_slots) {
  std::vector<v1::CheckpointTable> out;
  *num_slots = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    if (shards[s].store == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint shard ", s, " has no store"));
    }
    const uint32_t slots = shards[s].store->num_slots();
    if (*num_slots != 0 && slots != *num_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint shard ", s, " has ", slots, " slots, shard 0 has ",
          *num_slots));
    }
    *num_slots = slots;
    for (v1::CheckpointTable& t : StoreLayout(*shards[s].store)) {
      bool seen = false;
      for (const v1::CheckpointTable& have : out) {
        if (have.name() != t.name()) continue;
        seen = true;
        if (have.SerializeAsString() != t.SerializeAsString()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "checkpoint shard ", s, " stores table '", t.name(),
              "' with another layout than an earlier shard"));
        }
      }
      if (!seen) out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<CheckpointInfo> WriteCheckpoint(
    const std::string& root, const CheckpointSpec& spec,
    absl::Span<const ShardRows> shards, const RowFileOptions& options,
    FileSystem* fs) {
  if (shards.empty()) {
    return absl::InvalidArgumentError("a checkpoint needs at least one shard");
  }
  uint32_t num_slots = 0;
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointTable> tables,
                   MergedLayout(shards, &num_slots));
  RETURN_IF_ERROR(fs->CreateDir(root));
  const std::string dir = absl::StrCat(root, "/", CheckpointDirName(spec.step));
  if (ReadManifest(dir, fs).ok()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "checkpoint ", dir, " is already complete; remove it to write step ",
        spec.step, " again"));
  }
  RETURN_IF_ERROR(fs->RemoveTree(dir));  // a partial leftover of the same step
  RETURN_IF_ERROR(fs->CreateDir(dir));

  auto fail = [&](absl::Status status) {
    fs->RemoveTree(dir).IgnoreError();  // best effort: `status` is the news
    return status;
  };
  v1::CheckpointManifest manifest;
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_kind(v1::CHECKPOINT_KIND_FULL);
  manifest.set_step(spec.step);
  manifest.set_job_config_digest(spec.job_config_digest);
  *manifest.mutable_shard_map() = spec.shard_map;
  manifest.set_num_slots(num_slots);
  for (v1::CheckpointTable& t : tables) *manifest.add_tables() = std::move(t);

  const RowFileWriter writer(options);
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = absl::StrFormat("shard-%05d.sst", s);
    absl::StatusOr<RowFileInfo> info =
        writer.Write(*shards[s].store, shards[s].slots, absl::StrCat(dir, "/", name));
    if (!info.ok()) return fail(info.status());
    v1::CheckpointFile* file = manifest.add_files();
    file->set_name(name);
    file->set_size_bytes(info->size_bytes);
    file->set_crc32c(info->crc32c);
    file->set_rows(info->rows);
    file->set_shard(static_cast<uint32_t>(s));
  }
  // Row files' directory entries are durable before the manifest names them.
  absl::Status status = fs->SyncDir(dir);
  if (status.ok()) {
    manifest.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
    status = WriteManifest(dir, manifest, fs);
  }
  if (status.ok()) status = fs->SyncDir(root);
  if (!status.ok()) return fail(status);
  return CheckpointInfo{spec.step, dir, std::move(manifest)};
}

absl::StatusOr<RestoreStats> RestoreCheckpoint(
    const std::string& checkpoint_dir, absl::string_view expected_digest,
    SlotTransfer& store, absl::Span<const uint32_t> slots,
    const ImportOptions& options, FileSystem* fs) {
  const std::vector<uint32_t> all(slots.begin(), slots.end());
  const std::vector<std::vector<uint32_t>> by_table(store.num_tables(), all);
  const std::string dirs[] = {checkpoint_dir};
  return RestoreChain(dirs, expected_digest, store, by_table, options, fs);
}

absl::StatusOr<RestoreStats> RestoreChain(
    absl::Span<const std::string> dirs, absl::string_view expected_digest,
    SlotTransfer& store,
    absl::Span<const std::vector<uint32_t>> slots_by_table,
    const ImportOptions& options, FileSystem* fs) {
  if (dirs.empty()) {
    return absl::InvalidArgumentError("restore: the checkpoint chain is empty");
  }
  const std::vector<int64_t> rows_per_slot = store.RowsPerSlot();
  std::vector<v1::CheckpointManifest> manifests;
  for (size_t i = 0; i < dirs.size(); ++i) {
    const std::string& dir = dirs[i];
    ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadManifest(dir, fs));
    const std::string manifest_path = absl::StrCat(dir, "/", kManifestName);
    if (!expected_digest.empty() &&
        manifest.job_config_digest() != expected_digest) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint manifest ", manifest_path, " was written by job config ",
          manifest.job_config_digest(), ", not by this job (", expected_digest,
          "): restore a checkpoint of the same job config"));
    }
    if (i == 0 && manifest.kind() == v1::CHECKPOINT_KIND_INCREMENTAL) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", dir, " is incremental (base step ",
          manifest.base_step(), "): a chain starts with a full checkpoint"));
    }
    if (i > 0) {
      const v1::CheckpointManifest& prev = manifests.back();
      if (manifest.kind() != v1::CHECKPOINT_KIND_INCREMENTAL ||
          manifest.base_step() != prev.step()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "broken checkpoint chain: ", dir, " (step ", manifest.step(),
            manifest.kind() == v1::CHECKPOINT_KIND_INCREMENTAL
                ? absl::StrCat(", base step ", manifest.base_step())
                : std::string(", full"),
            ") does not follow ", dirs[i - 1], " (step ", prev.step(), ")"));
      }
    }
    if (manifest.num_slots() != rows_per_slot.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint manifest ", manifest_path, " has num_slots ",
          manifest.num_slots(), " but the restore target has ",
          rows_per_slot.size()));
    }
    RETURN_IF_ERROR(CheckLayout(
        manifest.tables(), store,
        absl::StrCat("checkpoint manifest ", manifest_path)));
    if (i == 0) {
      for (int t = 0; t < store.num_tables(); ++t) {
        bool found = false;
        for (const v1::CheckpointTable& saved : manifest.tables()) {
          found = found || saved.name() == store.spec(t).name;
        }
        if (!found) {
          return absl::FailedPreconditionError(absl::StrCat(
              "checkpoint manifest ", manifest_path, " has no table '",
              store.spec(t).name, "' of the restore target"));
        }
      }
    }
    manifests.push_back(std::move(manifest));
  }
  for (size_t t = 0; t < slots_by_table.size(); ++t) {
    for (uint32_t slot : slots_by_table[t]) {
      if (slot >= rows_per_slot.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "restore slot ", slot, " is outside the store's ",
            rows_per_slot.size(), " slots"));
      }
      if (rows_per_slot[slot] != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "restore target already holds ", rows_per_slot[slot],
            " rows in slot ", slot, "; restore into a fresh store"));
      }
    }
  }
  // Every file's size, header and layout are checked before the first row
  // is imported; its whole CRC while its rows are (a damaged file leaves
  // the store as it was: ImportRowFilesVerified undoes the import).
  RestoreStats stats;
  std::vector<std::unique_ptr<RowFileReader>> readers;
  std::vector<const RowFileReader*> chain;
  for (size_t i = 0; i < dirs.size(); ++i) {
    for (const v1::CheckpointFile& file : manifests[i].files()) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<RowFileReader> reader,
          RowFileReader::Open(absl::StrCat(dirs[i], "/", file.name()),
                              file.size_bytes(), file.crc32c(), options.pool,
                              RowFileReader::Verify::kLater));
      RETURN_IF_ERROR(CheckRowFileStore(*reader, store));
      stats.bytes += file.size_bytes();
      chain.push_back(reader.get());
      readers.push_back(std::move(reader));
    }
  }
  ASSIGN_OR_RETURN(stats.rows,
                   ImportRowFilesVerified(chain, store, slots_by_table, options));
  stats.files = static_cast<int>(readers.size());
  return stats;
}

}  // namespace recps::server::checkpoint

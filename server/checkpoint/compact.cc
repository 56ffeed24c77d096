#include "server/checkpoint/compact.h"

#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "server/checkpoint/chain.h"
#include "server/checkpoint/chain_merge.h"

namespace recps::server::checkpoint {

absl::StatusOr<CompactResult> CompactChain(const std::string& root,
                                           std::optional<uint64_t> step,
                                           const CompactOptions& options) {
  FileSystem* const fs = options.fs;
  ASSIGN_OR_RETURN(const std::vector<CheckpointInfo> chain,
                   ResolveChain(root, step, fs));
  const CheckpointInfo& last = chain.back();
  CompactResult result;
  result.chain_length = static_cast<int>(chain.size());
  if (chain.size() == 1) {
    result.checkpoint = last;
    for (const v1::CheckpointFile& f : last.manifest.files()) {
      result.rows += f.rows();
      result.bytes += f.size_bytes();
    }
    return result;
  }
  // Every file of the chain is checked whole first.
  std::vector<std::unique_ptr<RowFileReader>> owned;
  std::vector<const RowFileReader*> readers;
  int64_t rows_in_chain = 0;
  for (const CheckpointInfo& c : chain) {
    for (const v1::CheckpointFile& f : c.manifest.files()) {
      ASSIGN_OR_RETURN(std::unique_ptr<RowFileReader> r,
                       RowFileReader::Open(absl::StrCat(c.dir, "/", f.name()),
                                           f.size_bytes(), f.crc32c()));
      if (r->header().num_slots() != last.manifest.num_slots()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "row file ", r->path(), " has num_slots ", r->header().num_slots(),
            " but ", last.dir, " has ", last.manifest.num_slots()));
      }
      rows_in_chain += f.rows();
      readers.push_back(r.get());
      owned.push_back(std::move(r));
    }
  }
  // The output: as many files as the newest checkpoint has, by slot range.
  const uint32_t num_slots = std::max<uint32_t>(last.manifest.num_slots(), 1);
  const int n = std::max(1, last.manifest.files_size());
  absl::flat_hash_set<std::string> in_use;
  for (const v1::CheckpointFile& f : last.manifest.files()) in_use.insert(f.name());
  if (last.manifest.has_dense()) in_use.insert(last.manifest.dense().name());
  v1::RowFileHeader header;
  header.set_format_version(kRowFileFormatVersion);
  header.set_num_slots(last.manifest.num_slots());
  *header.mutable_tables() = last.manifest.tables();
  header.set_job_config_digest(last.manifest.job_config_digest());
  header.set_step(last.step);
  header.set_kind(v1::CHECKPOINT_KIND_FULL);
  std::vector<std::unique_ptr<RowFileBuilder>> out;
  std::vector<std::string> names;
  for (int k = 0; k < n; ++k) {
    std::string name = absl::StrFormat("shard-%05d.full.sst", k);
    for (int v = 2; in_use.contains(name); ++v) {
      name = absl::StrFormat("shard-%05d.full-%d.sst", k, v);
    }
    ASSIGN_OR_RETURN(std::unique_ptr<RowFileBuilder> b,
                     RowFileBuilder::Create(absl::StrCat(last.dir, "/", name),
                                            header, options.file));
    out.push_back(std::move(b));
    names.push_back(name);
  }
  ChainMerger merger(readers);
  absl::string_view key, value;
  absl::string_view table;
  uint32_t slot = 0;
  int64_t id = 0;
  int64_t written = 0;
  while (merger.Next(&key, &value)) {
    if (!DecodeRowKey(key, &table, &slot, &id) || slot >= num_slots) {
      return absl::DataLossError(absl::StrCat(
          "compacting ", last.dir, ": an entry of the chain is not a row key "
          "of this checkpoint (slot ", slot, ")"));
    }
    const int k = static_cast<int>(uint64_t{slot} * n / num_slots);
    RETURN_IF_ERROR(out[k]->AddEncoded(key, value));
    if (++written % 65536 == 0 && options.progress) {
      options.progress(written, rows_in_chain);
    }
  }
  RETURN_IF_ERROR(merger.status());
  v1::CheckpointManifest manifest = last.manifest;
  manifest.set_kind(v1::CHECKPOINT_KIND_FULL);
  manifest.set_base_step(0);
  manifest.set_full_step(0);
  manifest.clear_files();
  for (int k = 0; k < n; ++k) {
    ASSIGN_OR_RETURN(const RowFileInfo info, out[k]->Finish());
    v1::CheckpointFile* f = manifest.add_files();
    f->set_name(names[k]);
    f->set_size_bytes(info.size_bytes);
    f->set_crc32c(info.crc32c);
    f->set_rows(info.rows);
    f->set_shard(static_cast<uint32_t>(k));
    result.rows += info.rows;
    result.bytes += info.size_bytes;
  }
  if (options.progress) options.progress(written, rows_in_chain);
  // The new files' entries are durable before the manifest names them;
  // the manifest swap (temp, fdatasync, rename, dir fsync) is the commit.
  RETURN_IF_ERROR(fs->SyncDir(last.dir));
  RETURN_IF_ERROR(WriteManifest(last.dir, manifest, fs));
  // Only now the superseded files go (and leftovers of an interrupted
  // compaction: row files no manifest names).
  absl::flat_hash_set<std::string> keep(names.begin(), names.end());
  if (manifest.has_dense()) keep.insert(manifest.dense().name());
  // The new chain is committed: a file that cannot be listed or removed
  // now is only left over, for the next compaction.
  const absl::StatusOr<std::vector<FileSystem::DirEntry>> entries =
      fs->ListDir(last.dir);
  if (entries.ok()) {
    for (const FileSystem::DirEntry& e : *entries) {
      if (keep.contains(e.name) || !absl::EndsWith(e.name, ".sst")) continue;
      const std::string path = absl::StrCat(last.dir, "/", e.name);
      if (fs->RemoveFile(path).ok()) result.removed_files.push_back(path);
    }
  }
  RETURN_IF_ERROR(fs->SyncDir(last.dir));
  result.checkpoint = CheckpointInfo{last.step, last.dir, std::move(manifest)};
  return result;
}

}  // namespace recps::server::checkpoint

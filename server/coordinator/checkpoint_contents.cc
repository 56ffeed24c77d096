#include "server/coordinator/checkpoint_contents.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config/table_config.h"
#include "common/fused_row.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "common/wire/shard_map.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/manifest.h"

namespace recps::server {

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::vector<v1::CheckpointTable>> ManifestTables(
    const v1::JobConfig& job, const v1::ShardMap& map) {
  ASSIGN_OR_RETURN(const ShardMap parsed, ShardMap::FromProto(map));
  std::vector<v1::CheckpointTable> out;
  auto add = [&out](const std::string& name, const config::TableSpec& spec,
                    int dim) {
    v1::CheckpointTable t;
    t.set_name(name);
    t.set_dim(dim);
    t.set_optimizer_kind(static_cast<int32_t>(spec.optimizer.kind));
    t.set_row_stride(FusedRowStride(spec.optimizer.kind, dim));
    t.set_num_rows(spec.num_rows);
    out.push_back(std::move(t));
  };
  for (const v1::TableConfig& table : job.tables()) {
    ASSIGN_OR_RETURN(const config::TableSpec spec,
                     config::TableSpecFromConfig(table));
    add(spec.name, spec, spec.dim);
    for (const ColumnGroup& g :
         parsed.ColumnGroupsOf(StableNameKey(spec.name))) {
      add(g.table, spec, g.end - g.begin);
    }
  }
  return out;
}

absl::StatusOr<std::optional<v1::CheckpointFile>> WriteDenseState(
    const std::string& step_dir, const std::string& dense_state,
    FileSystem* fs) {
  if (dense_state.empty()) return std::nullopt;
  RETURN_IF_ERROR(fs->WriteFileAtomically(
      JoinPath(step_dir, kDenseStateFileName), dense_state));
  v1::CheckpointFile dense;
  dense.set_name(kDenseStateFileName);
  dense.set_size_bytes(dense_state.size());
  dense.set_crc32c(
      checkpoint::Crc32cExtend(0, dense_state.data(), dense_state.size()));
  return dense;
}

absl::StatusOr<v1::CheckpointManifest> MakeManifest(
    const ManifestParts& parts, const v1::JobConfig& job,
    std::vector<v1::CheckpointFile> files,
    const std::optional<v1::CheckpointFile>& dense,
    const std::vector<v1::WorkerPosition>& workers) {
  v1::CheckpointManifest manifest;
  manifest.set_format_version(checkpoint::kManifestFormatVersion);
  manifest.set_kind(parts.incremental ? v1::CHECKPOINT_KIND_INCREMENTAL
                                      : v1::CHECKPOINT_KIND_FULL);
  manifest.set_step(parts.step);
  manifest.set_job_config_digest(parts.job_config_digest);
  *manifest.mutable_shard_map() = parts.map;
  manifest.set_num_slots(parts.map.num_slots());
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointTable> tables,
                   ManifestTables(job, parts.map));
  for (v1::CheckpointTable& t : tables) *manifest.add_tables() = std::move(t);
  for (v1::CheckpointFile& f : files) *manifest.add_files() = std::move(f);
  if (dense.has_value()) *manifest.mutable_dense() = *dense;
  for (const v1::WorkerPosition& w : workers) *manifest.add_workers() = w;
  if (parts.incremental) {
    manifest.set_base_step(parts.base_step);
    manifest.set_full_step(parts.full_step);
  }
  manifest.set_reason(parts.reason);
  manifest.set_created_unix_ms(absl::ToUnixMillis(parts.created));
  return manifest;
}

}  // namespace recps::server

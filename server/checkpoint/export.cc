#include "server/checkpoint/export.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/checkpoint/chain_merge.h"
#include "server/checkpoint/crc32c.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the export format is little-endian; add byte swaps here");

namespace recps::server::checkpoint {
namespace {

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace

absl::StatusOr<ExportResult> ExportTable(
    const std::vector<CheckpointInfo>& chain, const std::string& table,
    const std::string& out_dir, const ExportOptions& options) {
  if (chain.empty()) {
    return absl::InvalidArgumentError("export: the checkpoint chain is empty");
  }
  const CheckpointInfo& last = chain.back();
  const v1::CheckpointTable* layout = nullptr;
  std::vector<std::string> names;
  for (const v1::CheckpointTable& t : last.manifest.tables()) {
    names.push_back(t.name());
    if (t.name() == table) layout = &t;
  }
  if (layout == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "checkpoint ", last.dir, " has no table '", table, "'; it has ",
        names.empty() ? "no tables" : absl::StrJoin(names, ", ")));
  }
  const int dim = layout->dim();
  const size_t row_bytes = static_cast<size_t>(layout->row_stride()) * 4;
  std::vector<std::unique_ptr<RowFileReader>> owned;
  std::vector<const RowFileReader*> readers;
  for (const CheckpointInfo& c : chain) {
    for (const v1::CheckpointFile& f : c.manifest.files()) {
      ASSIGN_OR_RETURN(std::unique_ptr<RowFileReader> r,
                       RowFileReader::Open(absl::StrCat(c.dir, "/", f.name()),
                                           f.size_bytes(), f.crc32c()));
      readers.push_back(r.get());
      owned.push_back(std::move(r));
    }
  }
  // Every row of the table, in key order (slot, then id); sorted by id
  // afterwards.
  std::vector<int64_t> ids;
  std::vector<float> weights;
  ChainMerger merger(readers);
  std::string prefix(table);
  prefix.push_back('\0');
  merger.Seek(prefix);
  absl::string_view key, value, name;
  uint32_t slot = 0;
  int64_t id = 0;
  while (merger.Next(&key, &value)) {
    if (!DecodeRowKey(key, &name, &slot, &id) || name != table) break;
    if (value.size() != row_bytes) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", last.dir, ": table '", table, "' id ", id,
          " has a row of ", value.size(), " bytes, expected ", row_bytes));
    }
    ids.push_back(id);
    const size_t at = weights.size();
    weights.resize(at + dim);
    std::memcpy(weights.data() + at, value.data(), sizeof(float) * dim);
    if (options.progress && ids.size() % 65536 == 0) options.progress(ids.size());
  }
  RETURN_IF_ERROR(merger.status());
  if (options.progress) options.progress(ids.size());
  std::vector<int64_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::string ids_bytes(ids.size() * sizeof(int64_t), '\0');
  std::string weight_bytes(ids.size() * dim * sizeof(float), '\0');
  for (size_t k = 0; k < order.size(); ++k) {
    std::memcpy(ids_bytes.data() + k * sizeof(int64_t), &ids[order[k]],
                sizeof(int64_t));
    std::memcpy(weight_bytes.data() + k * dim * sizeof(float),
                weights.data() + order[k] * dim, dim * sizeof(float));
  }
  FileSystem* const fs = options.fs;
  RETURN_IF_ERROR(fs->CreateDirs(out_dir));
  ExportResult result;
  result.ids_path = absl::StrCat(out_dir, "/", table, ".ids");
  result.weights_path = absl::StrCat(out_dir, "/", table, ".weights");
  result.meta_path = absl::StrCat(out_dir, "/", table, ".meta.json");
  result.rows = static_cast<int64_t>(ids.size());
  result.dim = dim;
  result.step = last.step;
  result.ids_crc32c = Crc32cExtend(0, ids_bytes.data(), ids_bytes.size());
  result.weights_crc32c =
      Crc32cExtend(0, weight_bytes.data(), weight_bytes.size());
  RETURN_IF_ERROR(fs->WriteFileAtomically(result.ids_path, ids_bytes));
  RETURN_IF_ERROR(fs->WriteFileAtomically(result.weights_path, weight_bytes));
  const std::string meta = absl::StrCat(
      "{\n  \"format_version\": ", kExportFormatVersion,
      ",\n  \"name\": ", JsonString(table), ",\n  \"dim\": ", dim,
      ",\n  \"rows\": ", result.rows, ",\n  \"dtype\": \"float32\"",
      ",\n  \"step\": ", result.step,
      ",\n  \"digest\": ", JsonString(last.manifest.job_config_digest()),
      ",\n  \"ids_crc32c\": \"", absl::Hex(result.ids_crc32c, absl::kZeroPad8),
      "\",\n  \"weights_crc32c\": \"",
      absl::Hex(result.weights_crc32c, absl::kZeroPad8), "\"\n}\n");
  RETURN_IF_ERROR(fs->WriteFileAtomically(result.meta_path, meta));
  return result;
}

}  // namespace recps::server::checkpoint

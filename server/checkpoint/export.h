// Export of a table's weights (format library), for serving and
// inspection: no optimizer state, a simple documented format.
//
// In OUT_DIR, for table T (docs/operations.md, "Export format"):
//   T.ids        int64 little-endian, ascending, one per row
//   T.weights    float32 little-endian, rows x dim, row i for ids[i]
//   T.meta.json  {"name", "dim", "rows", "dtype": "float32", "step",
//                 "digest" (the job config digest of the checkpoint),
//                 "ids_crc32c", "weights_crc32c" (8 hex digits each),
//                 "format_version": 1}
// Files are written under temporary names, fsynced and renamed; meta.json
// last, so a present meta.json means a complete export.
#ifndef RECPS_SERVER_CHECKPOINT_EXPORT_H_
#define RECPS_SERVER_CHECKPOINT_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "server/checkpoint/manifest.h"

namespace recps::server::checkpoint {

inline constexpr uint32_t kExportFormatVersion = 1;

struct ExportOptions {
  // Called now and then with the rows read so far.
  std::function<void(int64_t rows_read)> progress;
  // The output directory and files go through it; the row files are read
  // by RocksDB. Must outlive the call.
  FileSystem* fs = FileSystem::Default();
};

struct ExportResult {
  std::string ids_path;
  std::string weights_path;
  std::string meta_path;
  int64_t rows = 0;
  int dim = 0;
  uint64_t step = 0;
  uint32_t ids_crc32c = 0;
  uint32_t weights_crc32c = 0;
};

// Writes the weights of `table` at the last checkpoint of `chain` (oldest
// first, as ResolveChain gives it; later checkpoints override earlier
// ones) to `out_dir` (created when missing). Every row file is checked
// (size, CRC-32C) first. Holds every row's id and weights in memory
// (rows x (8 + 4 x dim) bytes) to sort by id. NOT_FOUND naming the table
// and the tables there are when the chain has no such table; errors of
// reading and writing name the file.
absl::StatusOr<ExportResult> ExportTable(
    const std::vector<CheckpointInfo>& chain, const std::string& table,
    const std::string& out_dir, const ExportOptions& options = {});

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_EXPORT_H_

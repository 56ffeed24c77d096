// Reader for Criteo's TSV click logs (Kaggle display advertising, Terabyte):
//   label \t I1 .. I13 \t C1 .. C26
// label is 0 or 1, I* are integer counts, C* are 32-bit hex hashes. Empty
// fields are allowed: an empty dense value reads as 0, an empty categorical
// as an empty bag. As an extension for multi-hot data, a categorical field
// may hold several hex values joined by ','.
#ifndef RECPS_WORKER_DATA_CRITEO_H_
#define RECPS_WORKER_DATA_CRITEO_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/batch.h"

namespace recps::worker {

struct CriteoConfig {
  // Read in order, as one stream of lines.
  std::vector<std::string> paths;
  // Per categorical feature: 0 keeps the parsed hex value as the id; N > 0
  // makes the id CriteoHashedId(field, N). Empty means 0 for every feature.
  std::vector<int64_t> hash_buckets;
  // Field counts after the label; Criteo's are 13 and 26.
  int num_dense = 13;
  int num_categorical = 26;
};

// What a reader has seen so far.
struct CriteoStats {
  int64_t lines = 0;      // lines this rank owned and parsed
  int64_t bad_lines = 0;  // of those, malformed and skipped
  std::string first_bad;  // "file:line: why" for the first bad line
};

// The dense transform: log(1 + max(x, 0)). Shared with the synthetic source
// so a synthetic TSV file reads back bit-identical.
inline float CriteoDenseTransform(double x) {
  return static_cast<float>(std::log1p(std::max(x, 0.0)));
}

// The id of one hex token in hash mode: a stable hash of the token's text
// modulo `buckets`. REQUIRES: buckets > 0.
int64_t CriteoHashedId(absl::string_view hex, int64_t buckets);

// Takes the lines whose 0-based number in the concatenation of all paths
// satisfies line_number % world_size == rank. A malformed line (wrong field
// count, a non-numeric dense value, bad hex, a label other than 0/1) is
// skipped and counted, never fatal; the first few are logged to stderr with
// file and line. Next returns partial last batches; errors are I/O errors.
class CriteoSource : public BatchSource {
 public:
  // Errors: INVALID_ARGUMENT for a bad config, NOT_FOUND / PERMISSION_DENIED
  // when a path cannot be opened (all are checked up front).
  static absl::StatusOr<std::unique_ptr<CriteoSource>> Create(
      const CriteoConfig& config, int rank, int world_size, int64_t batch_size);

  // Counts up to the last batch Next returned. Thread-safe.
  virtual CriteoStats stats() const = 0;
};

absl::StatusOr<std::unique_ptr<BatchSource>> MakeCriteoSource(
    const CriteoConfig& config, int rank, int world_size, int64_t batch_size);

}  // namespace recps::worker

#endif  // RECPS_WORKER_DATA_CRITEO_H_

#include "worker/data/batch.h"

namespace recps::worker {

void Batch::Clear() {
  size = 0;
  dense.clear();
  labels.clear();
  for (std::vector<int64_t>& v : ids) v.clear();
  // One entry keeps the "size + 1 offsets" invariant for the empty batch.
  for (std::vector<int64_t>& v : offsets) {
    v.clear();
    v.push_back(0);
  }
}

void ResetBatch(int num_dense, int num_sparse, Batch* batch) {
  batch->num_dense = num_dense;
  batch->ids.resize(num_sparse);
  batch->offsets.resize(num_sparse);
  batch->Clear();
}

absl::StatusOr<int64_t> BatchSource::Skip(int64_t n) {
  Batch scratch;
  int64_t skipped = 0;
  while (skipped < n) {
    absl::StatusOr<bool> more = Next(&scratch);
    if (!more.ok()) return more.status();
    if (!*more) break;
    ++skipped;
  }
  return skipped;
}

}  // namespace recps::worker

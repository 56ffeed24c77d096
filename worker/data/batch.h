// The worker's unit of input: a batch of samples with dense features, jagged
// sparse id features (like TorchRec's KeyedJaggedTensor) and labels, and the
// stream interface every data reader implements.
#ifndef RECPS_WORKER_DATA_BATCH_H_
#define RECPS_WORKER_DATA_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace recps::worker {

// One batch of samples. Sparse feature f of sample i has the ids
// ids[f][offsets[f][i] .. offsets[f][i + 1]).
struct Batch {
  int64_t size = 0;  // samples
  int num_dense = 0;
  // size x num_dense, transformed (log(1+x) for Criteo).
  std::vector<float> dense;
  std::vector<float> labels;              // size, 0 or 1
  std::vector<std::vector<int64_t>> ids;  // per sparse feature
  // Per sparse feature, size + 1 entries.
  std::vector<std::vector<int64_t>> offsets;
  int num_sparse() const { return static_cast<int>(ids.size()); }
  // Empties the batch but keeps its shape (num_dense, number of sparse
  // features) and every vector's capacity; offsets[f] becomes {0}.
  void Clear();
};

// Shapes `batch` for `num_dense` dense and `num_sparse` sparse features and
// empties it, reusing the capacity of what was there. Readers call it at the
// start of each Next.
void ResetBatch(int num_dense, int num_sparse, Batch* batch);

// A stream of batches. Next fills `batch` (reusing its capacity) and returns
// true, or false at the end of the data; errors are real I/O errors, not bad
// lines. Once Next returned false or an error, later calls do the same.
// Not thread-safe: one consumer.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual absl::StatusOr<bool> Next(Batch* batch) = 0;
  // Drops the next `n` batches as if Next had been called n times, so a
  // resumed run reads exactly the batches it would have read after its
  // checkpoint. Returns how many were dropped (fewer at the end of the data).
  // The default reads and drops them; readers that can seek override it
  // (the synthetic source jumps in O(1)).
  virtual absl::StatusOr<int64_t> Skip(int64_t n);
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_DATA_BATCH_H_

// Embedding-bag pooling: forward (gather + pool) and backward (gradient of the
// pooled output to one gradient row per stored row).
//
// Input is jagged, like TorchRec's KeyedJaggedTensor for one table: bag b
// covers positions [offsets[b], offsets[b+1]) of `indices`, and each index
// names a row of the row buffer. Rows may carry optimizer state after their
// weights (row_stride >= dim); only the first `dim` elements are read.
//
// CPU (`*Cpu`, the readable reference, host pointers) and CUDA (`*Cuda`,
// device pointers, asynchronous on ctx.cuda_stream) share each signature.
#ifndef RECPS_KERNELS_EMBEDDING_BAG_H_
#define RECPS_KERNELS_EMBEDDING_BAG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/exec_context.h"

namespace recps::kernels {

// Sums run in increasing position and start from their first term (a bag of
// one is exactly w * row), so results are deterministic and the same on
// every CPU path; mean divides the sum by the bag size.
enum class PoolingMode {
  kSum = 0,   // output[b] = sum_p w_p * row[indices[p]]
  kMean = 1,  // output[b] = sum / bag size (an empty bag gives zeros)
  kNone = 2,  // sequence output: output[p] = w_p * row[indices[p]]
};

struct EmbeddingBagForwardArgs {
  // num_rows rows of row_stride elements of `dtype`; weights are the first
  // `dim` elements of each row.
  const void* rows = nullptr;
  RowDType dtype = RowDType::kFloat32;
  int64_t num_rows = 0;
  int64_t row_stride = 0;
  int dim = 0;
  // num_indices row numbers in [0, num_rows); duplicates allowed.
  const int64_t* indices = nullptr;
  int64_t num_indices = 0;
  // num_bags + 1 entries: offsets[0] == 0, non-decreasing,
  // offsets[num_bags] == num_indices. Unused (may be null) for kNone.
  const int64_t* offsets = nullptr;
  int64_t num_bags = 0;
  // Optional per-position weights (num_indices), for kSum and kNone only.
  const float* per_sample_weights = nullptr;
  PoolingMode pooling = PoolingMode::kSum;
  // Row-major fp32 output: num_bags x dim (kSum, kMean) or num_indices x dim
  // (kNone). Fully overwritten.
  float* output = nullptr;
  // Floats from one output row to the next (0: dim). A larger stride writes
  // the rows into a wider matrix in place, e.g. one feature's column block
  // of the trainer's sample-major B x F x D pooled tensor (no copy after).
  // CPU only; CUDA refuses a stride other than 0 or dim.
  int64_t output_stride = 0;
};

// Returns INVALID_ARGUMENT for inconsistent shapes, bad offsets or (CPU) an
// index outside [0, num_rows), naming the position; output is then untouched.
// CUDA validates shapes on the host; it skips out-of-range indices.
absl::Status EmbeddingBagForwardCpu(const EmbeddingBagForwardArgs& args,
                                    const ExecContext& ctx);
absl::Status EmbeddingBagForwardCuda(const EmbeddingBagForwardArgs& args,
                                     const ExecContext& ctx);

struct EmbeddingBagBackwardArgs {
  // Gradient of the forward output, same shape as the forward output.
  const float* grad_output = nullptr;
  int dim = 0;
  // The forward's jagged input (offsets unused for kNone).
  const int64_t* indices = nullptr;
  int64_t num_indices = 0;
  const int64_t* offsets = nullptr;
  int64_t num_bags = 0;
  const float* per_sample_weights = nullptr;
  PoolingMode pooling = PoolingMode::kSum;
  // Row-major num_rows x dim output. Row r = sum over positions p with
  // indices[p] == r, in increasing p, of scale_p * grad_output[bag(p)], with
  // scale_p = w_p (sum / none) or 1 / |bag| (mean). Rows no index names are
  // zero. The fixed summation order makes the result deterministic.
  int64_t num_rows = 0;
  float* grad_rows = nullptr;
  // Floats from one grad_output row to the next (0: dim), as the forward's
  // output_stride. CPU only; CUDA refuses a stride other than 0 or dim.
  int64_t grad_output_stride = 0;
  // Add into grad_rows instead of overwriting them (CPU only): each row
  // that some index names gets its sum (formed as above, then added as one
  // term), the other rows are left as they are. Several features that share
  // a table accumulate in feature order with no zeroing pass and no scratch
  // rows: the first call overwrites every row (zeros where no index names
  // one), later ones accumulate.
  bool accumulate = false;
};

// Same validation as the forward.
absl::Status EmbeddingBagBackwardCpu(const EmbeddingBagBackwardArgs& args,
                                     const ExecContext& ctx);
absl::Status EmbeddingBagBackwardCuda(const EmbeddingBagBackwardArgs& args,
                                      const ExecContext& ctx);

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_EMBEDDING_BAG_H_

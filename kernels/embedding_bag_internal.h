// Internal to the CPU embedding-bag kernel: the per-ISA loops that
// embedding_bag_simd.cc defines and embedding_bag_cpu.cc dispatches to.
#ifndef RECPS_KERNELS_EMBEDDING_BAG_INTERNAL_H_
#define RECPS_KERNELS_EMBEDDING_BAG_INTERNAL_H_

#include <cstdint>

#include "kernels/embedding_bag.h"
#include "kernels/isa_dispatch.h"

namespace recps::kernels {

// The backward's gather list: for stored row r, its contributions are
// entries [row_begin[r], row_begin[r+1]), each a row of grad_output times a
// scale, in increasing position order (a stable counting sort by row).
struct EmbeddingBagBackwardPlan {
  const float* grad_output;
  int dim;
  int64_t grad_output_stride;  // floats between grad_output rows
  bool accumulate;             // add each row's sum into grad_rows
  const int64_t* row_begin;    // num_rows + 1
  const int64_t* source_row;   // grad_output row of each entry
  const float* scale;          // scale of each entry
  float* grad_rows;
};

RECPS_DECLARE_ISA_VARIANTS(
    void EmbeddingBagForwardRange(const EmbeddingBagForwardArgs& args,
                                  int64_t begin, int64_t end))
RECPS_DECLARE_ISA_VARIANTS(
    void EmbeddingBagBackwardRange(const EmbeddingBagBackwardPlan& plan,
                                   int64_t row_begin, int64_t row_end))

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_EMBEDDING_BAG_INTERNAL_H_

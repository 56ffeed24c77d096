// Internal to the CPU optimizers: per-ISA loops defined in optimizer_simd.cc.
#ifndef RECPS_KERNELS_OPTIMIZER_INTERNAL_H_
#define RECPS_KERNELS_OPTIMIZER_INTERNAL_H_

#include <cstdint>

#include "kernels/dense_optimizer.h"
#include "kernels/embedding_optimizer.h"
#include "kernels/isa_dispatch.h"

namespace recps::kernels {

// Updates rows for updates [begin, end) of validated args.
RECPS_DECLARE_ISA_VARIANTS(void FusedUpdateRange(const FusedUpdateArgs& args,
                                                 int64_t begin, int64_t end))
// Updates elements [begin, end) of validated args.
RECPS_DECLARE_ISA_VARIANTS(void DenseOptimizerRange(
    const DenseOptimizerArgs& args, AdamScale scale, int64_t begin,
    int64_t end))

// Lanes of the fixed-order sum used by row-wise Adagrad: element j is added
// to lane j % kRowSumLanes in increasing j, then lanes are added in order.
// Every ISA (and the CUDA twin, up to its own order) sums the same way.
inline constexpr int kRowSumLanes = 16;

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_OPTIMIZER_INTERNAL_H_

// The per-ISA loops behind interaction_cpu.cc and dense_layer_cpu.cc
// (kernels/dense_math_simd.cc); callers pick one with RECPS_ISA_SELECT.
#ifndef RECPS_KERNELS_DENSE_MATH_INTERNAL_H_
#define RECPS_KERNELS_DENSE_MATH_INTERNAL_H_

#include <cstdint>

#include "kernels/dense_layer.h"
#include "kernels/interaction.h"
#include "kernels/isa_dispatch.h"

namespace recps::kernels {

RECPS_DECLARE_ISA_VARIANTS(
    // Samples [lo, hi) of the batch.
    void DotInteractionForwardRange(const DotInteractionForwardArgs& a, int64_t lo, int64_t hi);
    void DotInteractionBackwardRange(const DotInteractionBackwardArgs& a, int64_t lo,
                                     int64_t hi);
    // Rows [lo, hi) of y, in place.
    void BiasActivationForwardRange(const BiasActivationForwardArgs& a, int64_t lo, int64_t hi);
    // Masks rows [lo, hi) of dy in place (when relu) and writes their column
    // sums to `sum` (n floats), rows added in increasing order.
    void BiasActivationBackwardBlock(const BiasActivationBackwardArgs& a, int64_t lo, int64_t hi,
                                     float* sum))

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_DENSE_MATH_INTERNAL_H_

// DLRM's pairwise dot-product feature interaction (Naumov et al. 2019).
//
// Per sample, T = [dense; sparse_0; ...; sparse_{F-1}] is (F + 1) x dim.
// The output row is the dense vector followed by the dot products
// <T_i, T_j> for every pair j < i, ordered by i then j:
// (1,0), (2,0), (2,1), (3,0), ... as DLRM's reference code does with
// `interaction_itself = False`.
#ifndef RECPS_KERNELS_INTERACTION_H_
#define RECPS_KERNELS_INTERACTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/exec_context.h"

namespace recps::kernels {

// dim + (F + 1) * F / 2.
int64_t DotInteractionOutputWidth(int num_sparse, int dim);

struct DotInteractionForwardArgs {
  int64_t batch = 0;
  int num_sparse = 0;  // F, pooled embeddings per sample
  int dim = 0;
  const float* dense = nullptr;   // batch x dim (bottom MLP output)
  const float* sparse = nullptr;  // batch x F x dim (pooled embeddings)
  float* output = nullptr;        // batch x DotInteractionOutputWidth
};

struct DotInteractionBackwardArgs {
  int64_t batch = 0;
  int num_sparse = 0;
  int dim = 0;
  const float* dense = nullptr;        // forward inputs
  const float* sparse = nullptr;
  const float* grad_output = nullptr;  // batch x DotInteractionOutputWidth
  float* grad_dense = nullptr;         // batch x dim, overwritten
  float* grad_sparse = nullptr;        // batch x F x dim, overwritten
};

absl::Status DotInteractionForwardCpu(const DotInteractionForwardArgs& args,
                                      const ExecContext& ctx);
absl::Status DotInteractionForwardCuda(const DotInteractionForwardArgs& args,
                                       const ExecContext& ctx);
absl::Status DotInteractionBackwardCpu(const DotInteractionBackwardArgs& args,
                                       const ExecContext& ctx);
absl::Status DotInteractionBackwardCuda(const DotInteractionBackwardArgs& args,
                                        const ExecContext& ctx);

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_INTERACTION_H_

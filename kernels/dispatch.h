// The device seam: one entry point per kernel that runs it where its
// ExecContext says (ctx.device): the CPU reference (with ctx.pool and
// ctx.isa) or the CUDA twin (on ctx.cuda_stream, with ctx.cublas_handle).
// Production code calls these, never the *Cpu / *Cuda functions directly, so
// that choosing the device is a flag in main() (ParseDevice) and nothing else.
// Inline, so that a binary links only the twins of the ops it calls.
#ifndef RECPS_KERNELS_DISPATCH_H_
#define RECPS_KERNELS_DISPATCH_H_

#include "absl/status/status.h"
#include "kernels/dense_layer.h"
#include "kernels/dense_optimizer.h"
#include "kernels/embedding_bag.h"
#include "kernels/embedding_optimizer.h"
#include "kernels/exec_context.h"
#include "kernels/gemm.h"
#include "kernels/interaction.h"
#include "kernels/loss.h"

namespace recps::kernels {

namespace internal {
// FAILED_PRECONDITION: `op` asked for CUDA in a build without CUDA kernels.
absl::Status NoCudaError(const char* op);
// INVALID_ARGUMENT for a Device value outside the enum.
absl::Status UnknownDeviceError(const char* op, Device device);
}  // namespace internal

// Runs the twin ctx.device names (the *Cuda twins exist only where
// RECPS_HAVE_CUDA is defined).
#if RECPS_HAVE_CUDA
#define RECPS_KERNEL_DISPATCH(op, args, ctx) \
  switch ((ctx).device) {                    \
    case Device::kCpu:                       \
      return op##Cpu((args), (ctx));         \
    case Device::kCuda:                      \
      return op##Cuda((args), (ctx));        \
  }                                          \
  return internal::UnknownDeviceError(#op, (ctx).device)
#else
#define RECPS_KERNEL_DISPATCH(op, args, ctx) \
  switch ((ctx).device) {                    \
    case Device::kCpu:                       \
      return op##Cpu((args), (ctx));         \
    case Device::kCuda:                      \
      return internal::NoCudaError(#op);     \
  }                                          \
  return internal::UnknownDeviceError(#op, (ctx).device)
#endif

inline absl::Status BiasActivationForward(const BiasActivationForwardArgs& args,
                                          const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(BiasActivationForward, args, ctx);
}
inline absl::Status BiasActivationBackward(
    const BiasActivationBackwardArgs& args, const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(BiasActivationBackward, args, ctx);
}
inline absl::Status DenseOptimizerStep(const DenseOptimizerArgs& args,
                                       const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(DenseOptimizerStep, args, ctx);
}
inline absl::Status EmbeddingBagForward(const EmbeddingBagForwardArgs& args,
                                        const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(EmbeddingBagForward, args, ctx);
}
inline absl::Status EmbeddingBagBackward(const EmbeddingBagBackwardArgs& args,
                                         const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(EmbeddingBagBackward, args, ctx);
}
inline absl::Status FusedOptimizerUpdate(const FusedUpdateArgs& args,
                                         const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(FusedOptimizerUpdate, args, ctx);
}
inline absl::Status Gemm(const GemmArgs& args, const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(Gemm, args, ctx);
}
inline absl::Status DotInteractionForward(const DotInteractionForwardArgs& args,
                                          const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(DotInteractionForward, args, ctx);
}
inline absl::Status DotInteractionBackward(
    const DotInteractionBackwardArgs& args, const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(DotInteractionBackward, args, ctx);
}
inline absl::Status SigmoidBce(const SigmoidBceArgs& args,
                               const ExecContext& ctx) {
  RECPS_KERNEL_DISPATCH(SigmoidBce, args, ctx);
}

#undef RECPS_KERNEL_DISPATCH

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_DISPATCH_H_

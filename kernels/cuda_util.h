// Host-side CUDA helpers that code without CUDA headers may include.
#ifndef RECPS_KERNELS_CUDA_UTIL_H_
#define RECPS_KERNELS_CUDA_UTIL_H_

#include "absl/status/statusor.h"

namespace recps::kernels {

#if defined(RECPS_HAVE_CUDA)
// True when the build has CUDA and a usable GPU is present (false, without an
// error, where the driver or device is missing).
bool CudaDeviceAvailable();
// A cuBLAS handle for ExecContext.cublas_handle (cuBLAS is loaded on first
// use, see cuda_util.cuh); FAILED_PRECONDITION when cuBLAS cannot be loaded.
absl::StatusOr<void*> CreateCublasHandle();
void DestroyCublasHandle(void* handle);
#else
inline bool CudaDeviceAvailable() { return false; }
#endif

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_CUDA_UTIL_H_

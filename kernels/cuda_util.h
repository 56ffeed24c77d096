// Host-side CUDA helpers that code without CUDA headers may include.
#ifndef RECPS_KERNELS_CUDA_UTIL_H_
#define RECPS_KERNELS_CUDA_UTIL_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace recps::kernels {

// Whether the machine has an NVIDIA GPU installed (/dev/nvidia0 .. 15
// exist), whatever the CUDA runtime says. In every build.
bool NvidiaDeviceFilesPresent();
// The number of usable CUDA GPUs: 0 when the build has no CUDA (installed
// GPUs or not) or the machine has no driver or no GPU; INTERNAL when a GPU is installed
// (NvidiaDeviceFilesPresent) but CUDA cannot initialise. GPU tests skip on
// 0 and fail on an error (CudaDeviceAvailable cannot tell the two apart).
absl::StatusOr<int> CudaDeviceCount();
// OK when GPU `device` can be used; FAILED_PRECONDITION naming cuda:N and
// why not otherwise (built without CUDA, no driver, no GPU, N out of range).
absl::Status CheckCudaDevice(int device);

#if defined(RECPS_HAVE_CUDA)
// True when the build has CUDA and a usable GPU is present (false, without an
// error, where the driver or device is missing).
bool CudaDeviceAvailable();
// A cuBLAS handle for ExecContext.cublas_handle (cuBLAS is loaded on first
// use, see cuda_util.cuh); FAILED_PRECONDITION when cuBLAS cannot be loaded.
absl::StatusOr<void*> CreateCublasHandle();
void DestroyCublasHandle(void* handle);
// cudaMemGetInfo of GPU `device`: its free and total bytes.
absl::Status CudaMemInfo(int device, int64_t* free_bytes, int64_t* total_bytes);
#else
inline bool CudaDeviceAvailable() { return false; }
#endif

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_CUDA_UTIL_H_

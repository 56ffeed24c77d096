// Internal to kernels/device_memory.cc: the CUDA runtime calls it makes,
// behind plain pointers so that no CUDA header is needed to call them.
// Defined in device_memory.cu, only in builds with CUDA.
#ifndef RECPS_KERNELS_DEVICE_MEMORY_CUDA_H_
#define RECPS_KERNELS_DEVICE_MEMORY_CUDA_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recps::kernels::internal {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// GPUs visible to this process; 0 (not an error) without a driver or device.
int CudaVisibleDevices();
absl::Status CudaSetDevice(int device);
absl::StatusOr<void*> CudaAlloc(size_t bytes, int device);
// Waits for the device first, so no queued work still uses the memory.
void CudaFree(void* ptr, int device);
absl::Status CudaCopy(void* dst, const void* src, size_t bytes, CopyKind kind,
                      void* stream);
// Device-to-device 2D copy (pitches and width in bytes).
absl::Status CudaCopy2D(void* dst, size_t dst_pitch, const void* src,
                        size_t src_pitch, size_t width, size_t rows,
                        void* stream);
absl::Status CudaZero(void* dst, size_t bytes, void* stream);
// stream == nullptr: waits for the whole current device.
absl::Status CudaStreamSync(void* stream);
// A non-blocking stream on `device` (which becomes current).
absl::StatusOr<void*> CudaCreateStream(int device);
void CudaDestroyStream(void* stream);

}  // namespace recps::kernels::internal

#endif  // RECPS_KERNELS_DEVICE_MEMORY_CUDA_H_

// CUDA runtime calls behind kernels/device_memory_cuda.h.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_util.cuh"
#include "kernels/device_memory_cuda.h"

namespace recps::kernels::internal {

int CudaVisibleDevices() {
  if (!CudaDeviceAvailable()) return 0;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

absl::Status CudaSetDevice(int device) {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device),
                       absl::StrCat("cudaSetDevice(", device, ")").c_str());
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaAlloc(size_t bytes, int device) {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "cudaSetDevice");
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "cudaMalloc of ", bytes, " bytes on cuda:", device, " failed: ",
        cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  return ptr;
}

void CudaFree(void* ptr, int device) {
  if (ptr == nullptr) return;
  (void)cudaSetDevice(device);
  (void)cudaDeviceSynchronize();
  (void)cudaFree(ptr);
}

absl::Status CudaCopy2D(void* dst, size_t dst_pitch, const void* src,
                        size_t src_pitch, size_t width, size_t rows,
                        void* stream) {
  if (width == 0 || rows == 0) return absl::OkStatus();
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                        cudaMemcpyDeviceToDevice,
                        static_cast<cudaStream_t>(stream)),
      "cudaMemcpy2DAsync (device to device)");
  return absl::OkStatus();
}

absl::Status CudaCopy(void* dst, const void* src, size_t bytes, CopyKind kind,
                      void* stream) {
  if (bytes == 0) return absl::OkStatus();
  cudaMemcpyKind k = cudaMemcpyDeviceToDevice;
  const char* op = "cudaMemcpyAsync (device to device)";
  if (kind == CopyKind::kHostToDevice) {
    k = cudaMemcpyHostToDevice;
    op = "cudaMemcpyAsync (host to device)";
  } else if (kind == CopyKind::kDeviceToHost) {
    k = cudaMemcpyDeviceToHost;
    op = "cudaMemcpyAsync (device to host)";
  }
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)),
      op);
  return absl::OkStatus();
}

absl::Status CudaZero(void* dst, size_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_CUDA_ERROR(
      cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream)),
      "cudaMemsetAsync");
  return absl::OkStatus();
}

absl::Status CudaStreamSync(void* stream) {
  if (stream == nullptr) {
    // No stream: the whole device (the workers' streams are non-blocking,
    // so the legacy default stream alone would not wait for them).
    RETURN_IF_CUDA_ERROR(
        cudaDeviceSynchronize(),
        "cudaDeviceSynchronize (a kernel or copy queued before it failed)");
    return absl::OkStatus();
  }
  RETURN_IF_CUDA_ERROR(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
      "cudaStreamSynchronize (a kernel or copy queued before it failed)");
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaCreateStream(int device) {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  RETURN_IF_CUDA_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags");
  return static_cast<void*>(stream);
}

void CudaDestroyStream(void* stream) {
  if (stream == nullptr) return;
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

}  // namespace recps::kernels::internal

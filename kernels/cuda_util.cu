// Host-side CUDA helpers shared by the kernels (see cuda_util.cuh).
#include "absl/strings/str_cat.h"
#include "kernels/cuda_util.cuh"

namespace recps::kernels {

bool CudaDeviceAvailable() {
  // Probed once: the answer cannot change during a process.
  static const bool available = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      // No driver (cudaErrorInsufficientDriver) or no device: clear the
      // error so that it does not surface at the next unrelated call.
      (void)cudaGetLastError();
      return false;
    }
    return count > 0;
  }();
  return available;
}

absl::Status CudaErrorToStatus(cudaError_t err, const char* op) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      op, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

absl::Status CublasStatusToStatus(cublasStatus_t status, const char* op) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(op, " failed: ", cublasGetStatusName(status), ": ",
                   cublasGetStatusString(status)));
}

absl::Status StreamBuffer::Allocate(size_t bytes, const char* what) {
  if (ptr_ != nullptr) {
    return absl::InternalError(
        absl::StrCat("StreamBuffer for ", what, " allocated twice"));
  }
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t err = cudaMallocAsync(&ptr_, bytes, stream_);
  if (err != cudaSuccess) {
    ptr_ = nullptr;
    return absl::InternalError(absl::StrCat(
        "cudaMallocAsync of ", bytes, " bytes for ", what,
        " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace recps::kernels

// Host-side CUDA helpers shared by the kernels (see cuda_util.cuh).
#include <dlfcn.h>

#include <string>
#include <utility>

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

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess) return count;
  (void)cudaGetLastError();
  if (NvidiaDeviceFilesPresent()) {
    return absl::InternalError(absl::StrCat(
        "an NVIDIA GPU is installed (/dev/nvidia*) but CUDA cannot "
        "initialise: cudaGetDeviceCount: ",
        cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  return 0;
}

absl::Status CheckCudaDevice(int device) {
  const std::string name = absl::StrCat("cuda:", device);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    const char* why =
        err == cudaErrorInsufficientDriver
            ? "no usable NVIDIA driver"
            : err == cudaErrorNoDevice ? "this machine has no CUDA GPU"
                                       : "CUDA cannot initialise";
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", name, ": ", why, " (cudaGetDeviceCount: ",
        cudaGetErrorName(err), ": ", cudaGetErrorString(err),
        "); run with --device=cpu"));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", name, ": this machine has no CUDA GPU; run with "
        "--device=cpu"));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", name, ": out of range: this machine has ", count,
        " CUDA GPU(s), cuda:0 to cuda:", count - 1));
  }
  return absl::OkStatus();
}

absl::Status CudaMemInfo(int device, int64_t* free_bytes,
                         int64_t* total_bytes) {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "cudaSetDevice");
  size_t free_b = 0, total_b = 0;
  RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  *free_bytes = static_cast<int64_t>(free_b);
  *total_bytes = static_cast<int64_t>(total_b);
  return absl::OkStatus();
}

absl::Status CudaErrorToStatus(cudaError_t err, const char* op) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      op, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

absl::Status CublasStatusToStatus(cublasStatus_t status, const char* op) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  absl::StatusOr<const CublasApi*> api = Cublas();
  if (!api.ok()) {
    return absl::InternalError(absl::StrCat(op, " failed: cuBLAS status ",
                                            static_cast<int>(status)));
  }
  return absl::InternalError(
      absl::StrCat(op, " failed: ", (*api)->status_name(status), ": ",
                   (*api)->status_string(status)));
}

absl::StatusOr<const CublasApi*> Cublas() {
  static const absl::StatusOr<const CublasApi*> loaded =
      []() -> absl::StatusOr<const CublasApi*> {
    const std::string name = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot load ", name, ": ", dlerror()));
    }
    auto* api = new CublasApi();
    const std::pair<void**, const char*> symbols[] = {
        {reinterpret_cast<void**>(&api->create), "cublasCreate_v2"},
        {reinterpret_cast<void**>(&api->destroy), "cublasDestroy_v2"},
        {reinterpret_cast<void**>(&api->set_stream), "cublasSetStream_v2"},
        {reinterpret_cast<void**>(&api->sgemm_64), "cublasSgemm_v2_64"},
        {reinterpret_cast<void**>(&api->status_name), "cublasGetStatusName"},
        {reinterpret_cast<void**>(&api->status_string), "cublasGetStatusString"},
    };
    for (const auto& [slot, symbol] : symbols) {
      *slot = dlsym(lib, symbol);
      if (*slot == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(name, " has no ", symbol, ": ", dlerror()));
      }
    }
    return api;
  }();
  return loaded;
}

absl::StatusOr<void*> CreateCublasHandle() {
  absl::StatusOr<const CublasApi*> api = Cublas();
  if (!api.ok()) return api.status();
  cublasHandle_t handle = nullptr;
  const cublasStatus_t s = (*api)->create(&handle);
  if (s != CUBLAS_STATUS_SUCCESS) return CublasStatusToStatus(s, "cublasCreate");
  return static_cast<void*>(handle);
}

void DestroyCublasHandle(void* handle) {
  absl::StatusOr<const CublasApi*> api = Cublas();
  if (api.ok() && handle != nullptr) {
    (*api)->destroy(static_cast<cublasHandle_t>(handle));
  }
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

#include "kernels/device_memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.h"
#if RECPS_HAVE_CUDA
#include "kernels/device_memory_cuda.h"
#endif

namespace recps::kernels {
namespace {

#if !RECPS_HAVE_CUDA
absl::Status NoCuda(const char* what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": this build has no CUDA (built without nvcc); use --device=cpu "
            "or a build made where nvcc is present"));
}
#endif

absl::Status UnknownDevice(const char* what, Device device) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": unknown device ", static_cast<int>(device)));
}

}  // namespace

template <typename T>
DeviceArray<T>::~DeviceArray() {
  Release();
}

template <typename T>
DeviceArray<T>::DeviceArray(DeviceArray&& other) noexcept
    : device_(other.device_),
      cuda_device_(other.cuda_device_),
      size_(std::exchange(other.size_, 0)),
      host_(std::move(other.host_)),
      device_ptr_(std::exchange(other.device_ptr_, nullptr)) {}

template <typename T>
DeviceArray<T>& DeviceArray<T>::operator=(DeviceArray&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    cuda_device_ = other.cuda_device_;
    size_ = std::exchange(other.size_, 0);
    host_ = std::move(other.host_);
    device_ptr_ = std::exchange(other.device_ptr_, nullptr);
  }
  return *this;
}

template <typename T>
void DeviceArray<T>::Release() {
#if RECPS_HAVE_CUDA
  if (device_ptr_ != nullptr) internal::CudaFree(device_ptr_, cuda_device_);
#endif
  device_ptr_ = nullptr;
  host_.clear();
  size_ = 0;
}

template <typename T>
absl::Status DeviceArray<T>::Resize(size_t n) {
  if (n <= size_) return absl::OkStatus();
  switch (device_) {
    case Device::kCpu:
      host_.resize(n);
      size_ = n;
      return absl::OkStatus();
    case Device::kCuda: {
#if RECPS_HAVE_CUDA
      ASSIGN_OR_RETURN(void* block, internal::CudaAlloc(n * sizeof(T), cuda_device_));
      T* grown = static_cast<T*>(block);
      // Work queued on any stream may still write the old block: let it
      // finish before its contents are copied.
      absl::Status s = size_ > 0 ? internal::CudaStreamSync(nullptr) : absl::OkStatus();
      // On the legacy default stream, waited for below.
      if (s.ok()) s = internal::CudaZero(grown + size_, (n - size_) * sizeof(T), nullptr);
      if (s.ok() && size_ > 0) {
        s = internal::CudaCopy(grown, device_ptr_, size_ * sizeof(T),
                               internal::CopyKind::kDeviceToDevice, nullptr);
      }
      if (s.ok()) s = internal::CudaStreamSync(nullptr);
      if (!s.ok()) {
        internal::CudaFree(grown, cuda_device_);
        return s;
      }
      internal::CudaFree(device_ptr_, cuda_device_);
      device_ptr_ = grown;
      size_ = n;
      return absl::OkStatus();
#else
      return NoCuda("DeviceArray::Resize");
#endif
    }
  }
  return UnknownDevice("DeviceArray::Resize", device_);
}

template class DeviceArray<float>;
template class DeviceArray<int64_t>;

namespace {

absl::Status Copy(void* dst, const void* src, size_t n, size_t element_size,
                  const ExecContext& ctx, [[maybe_unused]] int kind,
                  const char* what) {
  if (n == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": null ", dst == nullptr ? "destination" : "source",
                     " for ", n, " floats"));
  }
  switch (ctx.device) {
    case Device::kCpu:
      if (dst != src) std::memmove(dst, src, n * element_size);
      return absl::OkStatus();
    case Device::kCuda:
#if RECPS_HAVE_CUDA
      return internal::CudaCopy(dst, src, n * element_size,
                                static_cast<internal::CopyKind>(kind),
                                ctx.cuda_stream);
#else
      return NoCuda(what);
#endif
  }
  return UnknownDevice(what, ctx.device);
}

}  // namespace

#if RECPS_HAVE_CUDA
#define RECPS_COPY_KIND(k) static_cast<int>(internal::CopyKind::k)
#else
#define RECPS_COPY_KIND(k) 0
#endif

absl::Status CopyToDevice(float* device, const float* host, size_t n,
                          const ExecContext& ctx) {
  return Copy(device, host, n, sizeof(float), ctx, RECPS_COPY_KIND(kHostToDevice),
              "CopyToDevice");
}

absl::Status CopyToDevice(int64_t* device, const int64_t* host, size_t n,
                          const ExecContext& ctx) {
  return Copy(device, host, n, sizeof(int64_t), ctx,
              RECPS_COPY_KIND(kHostToDevice), "CopyToDevice");
}

absl::Status CopyToHost(float* host, const float* device, size_t n,
                        const ExecContext& ctx) {
  return Copy(host, device, n, sizeof(float), ctx, RECPS_COPY_KIND(kDeviceToHost),
              "CopyToHost");
}

absl::Status CopyOnDevice(float* dst, const float* src, size_t n,
                          const ExecContext& ctx) {
  return Copy(dst, src, n, sizeof(float), ctx, RECPS_COPY_KIND(kDeviceToDevice),
              "CopyOnDevice");
}

#undef RECPS_COPY_KIND

absl::Status CopyStridedOnDevice(float* dst, size_t dst_stride,
                                 const float* src, size_t src_stride,
                                 size_t width, size_t rows,
                                 const ExecContext& ctx) {
  if (width == 0 || rows == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyStridedOnDevice: null ", dst == nullptr ? "destination" : "source"));
  }
  if (width > dst_stride || width > src_stride) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyStridedOnDevice: rows of ", width, " floats do not fit strides ",
        src_stride, " (source) and ", dst_stride, " (destination)"));
  }
  switch (ctx.device) {
    case Device::kCpu:
      for (size_t r = 0; r < rows; ++r) {
        std::memmove(dst + r * dst_stride, src + r * src_stride, width * sizeof(float));
      }
      return absl::OkStatus();
    case Device::kCuda:
#if RECPS_HAVE_CUDA
      return internal::CudaCopy2D(dst, dst_stride * sizeof(float), src,
                                  src_stride * sizeof(float), width * sizeof(float),
                                  rows, ctx.cuda_stream);
#else
      return NoCuda("CopyStridedOnDevice");
#endif
  }
  return UnknownDevice("CopyStridedOnDevice", ctx.device);
}

absl::Status ZeroOnDevice(float* device, size_t n, const ExecContext& ctx) {
  if (n == 0) return absl::OkStatus();
  if (device == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZeroOnDevice: null destination for ", n, " floats"));
  }
  switch (ctx.device) {
    case Device::kCpu:
      std::fill(device, device + n, 0.0f);
      return absl::OkStatus();
    case Device::kCuda:
#if RECPS_HAVE_CUDA
      return internal::CudaZero(device, n * sizeof(float), ctx.cuda_stream);
#else
      return NoCuda("ZeroOnDevice");
#endif
  }
  return UnknownDevice("ZeroOnDevice", ctx.device);
}

absl::Status Synchronize(const ExecContext& ctx) {
  switch (ctx.device) {
    case Device::kCpu:
      return absl::OkStatus();
    case Device::kCuda:
#if RECPS_HAVE_CUDA
      return internal::CudaStreamSync(ctx.cuda_stream);
#else
      return NoCuda("Synchronize");
#endif
  }
  return UnknownDevice("Synchronize", ctx.device);
}

absl::Status CheckDeviceUsable(Device device, int cuda_device) {
  if (device == Device::kCpu) return absl::OkStatus();
  if (device != Device::kCuda) return UnknownDevice("CheckDeviceUsable", device);
  const std::string name = DeviceName(device, cuda_device);
#if RECPS_HAVE_CUDA
  const int visible = internal::CudaVisibleDevices();
  if (visible == 0) {
    const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", name, ": no CUDA device is visible to this process "
        "(cudaGetDeviceCount found none",
        env != nullptr ? absl::StrCat("; CUDA_VISIBLE_DEVICES=", env) : "",
        "); run with --device=cpu on a machine without a GPU"));
  }
  if (cuda_device >= visible) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", name, ": only ", visible, " CUDA device(s) are visible "
        "(ordinals 0..", visible - 1, ")"));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "device ", name, ": this build has no CUDA (built without nvcc); run "
      "with --device=cpu or use a build made where nvcc is present"));
#endif
}

absl::StatusOr<std::unique_ptr<ExecResources>> ExecResources::Create(
    Device device, int cuda_device, ThreadPool* pool) {
  RETURN_IF_ERROR(CheckDeviceUsable(device, cuda_device));
  std::unique_ptr<ExecResources> r(new ExecResources());
  r->ctx_.pool = pool;
  r->ctx_.device = device;
  r->ctx_.cuda_device = device == Device::kCuda ? cuda_device : 0;
#if RECPS_HAVE_CUDA
  if (device == Device::kCuda) {
    const std::string name = DeviceName(device, cuda_device);
    absl::StatusOr<void*> stream = internal::CudaCreateStream(cuda_device);
    if (!stream.ok()) {
      return absl::Status(stream.status().code(),
                          absl::StrCat("device ", name, ": ", stream.status().message()));
    }
    r->ctx_.cuda_stream = *stream;
    absl::StatusOr<void*> handle = CreateCublasHandle();
    if (!handle.ok()) {
      return absl::Status(handle.status().code(),
                          absl::StrCat("device ", name, ": ", handle.status().message()));
    }
    r->ctx_.cublas_handle = *handle;
  }
#endif
  return r;
}

ExecResources::~ExecResources() {
#if RECPS_HAVE_CUDA
  if (ctx_.cublas_handle != nullptr) DestroyCublasHandle(ctx_.cublas_handle);
  if (ctx_.cuda_stream != nullptr) internal::CudaDestroyStream(ctx_.cuda_stream);
#endif
}

}  // namespace recps::kernels

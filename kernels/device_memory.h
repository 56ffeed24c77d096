// The device memory seam: float buffers that live where an ExecContext's
// kernels run (host memory for kCpu, cudaMalloc'd memory for kCuda), the
// copies between them and the host, and the stream and cuBLAS handle a CUDA
// ExecContext needs. No CUDA headers here: code that builds without CUDA
// uses the same calls, and the CUDA paths return FAILED_PRECONDITION there.
#ifndef RECPS_KERNELS_DEVICE_MEMORY_H_
#define RECPS_KERNELS_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "kernels/exec_context.h"

namespace recps::kernels {

// A grow-only array of T (float or int64_t) on one device. kCpu: a
// std::vector (so the CPU path keeps exactly its old memory and
// zero-filling). kCuda: one cudaMalloc'd block on GPU `cuda_device`, freed
// after the device is idle.
template <typename T>
class DeviceArray {
 public:
  // An empty host buffer.
  DeviceArray() = default;
  DeviceArray(Device device, int cuda_device)
      : device_(device), cuda_device_(cuda_device) {}
  ~DeviceArray();
  DeviceArray(DeviceArray&& other) noexcept;
  DeviceArray& operator=(DeviceArray&& other) noexcept;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  // Grows to `n` elements (never shrinks), keeping the contents and zeroing
  // the new elements, as std::vector::resize. CUDA: synchronous (waits for
  // the device); RESOURCE_EXHAUSTED naming the size when cudaMalloc fails;
  // FAILED_PRECONDITION in a build without CUDA.
  absl::Status Resize(size_t n);

  T* data() { return device_ == Device::kCpu ? host_.data() : device_ptr_; }
  const T* data() const {
    return device_ == Device::kCpu ? host_.data() : device_ptr_;
  }
  size_t size() const { return size_; }
  Device device() const { return device_; }
  int cuda_device() const { return cuda_device_; }

 private:
  void Release();

  Device device_ = Device::kCpu;
  int cuda_device_ = 0;
  size_t size_ = 0;
  std::vector<T> host_;      // kCpu
  T* device_ptr_ = nullptr;  // kCuda
};

extern template class DeviceArray<float>;
extern template class DeviceArray<int64_t>;
using DeviceBuffer = DeviceArray<float>;

// Copies of `n` floats, ordered on ctx.cuda_stream for kCuda (complete when
// the stream is synchronized: keep host buffers alive until then) and plain
// copies for kCpu. `device` pointers are memory of ctx's device (a
// DeviceBuffer of ctx.device), `host` pointers host memory. n = 0 is a no-op.
absl::Status CopyToDevice(float* device, const float* host, size_t n,
                          const ExecContext& ctx);
absl::Status CopyToHost(float* host, const float* device, size_t n,
                        const ExecContext& ctx);
absl::Status CopyOnDevice(float* dst, const float* src, size_t n,
                          const ExecContext& ctx);
absl::Status CopyToDevice(int64_t* device, const int64_t* host, size_t n,
                          const ExecContext& ctx);
// `rows` rows of `width` floats from src (rows `src_stride` floats apart)
// to dst (rows `dst_stride` floats apart), both device memory: one
// feature's column block in and out of a sample-major B x F x D tensor.
absl::Status CopyStridedOnDevice(float* dst, size_t dst_stride,
                                 const float* src, size_t src_stride,
                                 size_t width, size_t rows,
                                 const ExecContext& ctx);
// Sets n floats of device memory to 0.0f.
absl::Status ZeroOnDevice(float* device, size_t n, const ExecContext& ctx);
// Waits for everything queued on ctx's stream, or on the whole GPU when
// ctx.cuda_stream is null (kCpu: nothing to wait for). Kernel faults
// surface here as INTERNAL.
absl::Status Synchronize(const ExecContext& ctx);

// Owns what a CUDA ExecContext points at (a non-blocking stream and a cuBLAS
// handle on the chosen GPU) or, for kCpu, nothing. One per thread that
// launches work; not thread-safe.
class ExecResources {
 public:
  // Checks that `device` is usable and builds its context (pool for the
  // CPU kernels either way). Errors name the device and the reason, e.g.
  // FAILED_PRECONDITION "device cuda:0: no CUDA device is visible ..." or
  // "... this build has no CUDA"; INTERNAL when the stream or cuBLAS cannot
  // be created. The calling thread's current GPU becomes `cuda_device`.
  static absl::StatusOr<std::unique_ptr<ExecResources>> Create(
      Device device, int cuda_device, ThreadPool* pool);
  ~ExecResources();
  ExecResources(const ExecResources&) = delete;
  ExecResources& operator=(const ExecResources&) = delete;

  const ExecContext& ctx() const { return ctx_; }

 private:
  ExecResources() = default;
  ExecContext ctx_;
};

// OK when `device` can run here (kCpu always; kCuda when the build has CUDA
// and GPU `cuda_device` is visible); otherwise FAILED_PRECONDITION naming
// the device and the reason. Cheap: for start-up checks.
absl::Status CheckDeviceUsable(Device device, int cuda_device);

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_DEVICE_MEMORY_H_

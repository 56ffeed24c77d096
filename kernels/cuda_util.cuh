// Internal to the CUDA kernels (*.cu): error-to-Status conversion, stream
// access, launch-shape helpers, stream-ordered scratch memory and vector
// loads. Not for code built without nvcc.
#ifndef RECPS_KERNELS_CUDA_UTIL_CUH_
#define RECPS_KERNELS_CUDA_UTIL_CUH_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/half.h"
#include "kernels/cuda_util.h"
#include "kernels/exec_context.h"

namespace recps::kernels {

// INTERNAL status naming `op` and the CUDA error; OK for cudaSuccess.
absl::Status CudaErrorToStatus(cudaError_t err, const char* op);
// Same for cuBLAS.
absl::Status CublasStatusToStatus(cublasStatus_t status, const char* op);

// The cuBLAS entry points the kernels use, loaded with dlopen on first use
// rather than linked: libcublasLt's ~94 KiB of static TLS, added to
// OpenBLAS's, leaves no room in the 100 KiB stacks of civetweb's threads
// (the Prometheus exposer), so every binary that linked cuBLAS could not
// serve metrics. Processes that never run a GEMM on the GPU never load it.
struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemm_v2_64) sgemm_64;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};
// The loaded API; FAILED_PRECONDITION naming the library and dlerror() when
// it cannot be loaded. Thread-safe; loads once.
absl::StatusOr<const CublasApi*> Cublas();

// Returns an INTERNAL status from the enclosing function when `expr` (a
// cudaError_t) fails; `op` names the operation in the message.
#define RETURN_IF_CUDA_ERROR(expr, op)                                   \
  do {                                                                   \
    const cudaError_t recps_cuda_err_ = (expr);                          \
    if (recps_cuda_err_ != cudaSuccess) {                                \
      return ::recps::kernels::CudaErrorToStatus(recps_cuda_err_, (op)); \
    }                                                                    \
  } while (0)

// Checks the launch just made (bad configuration, missing kernel image).
// Execution errors surface later, at a synchronizing call of the caller.
#define RETURN_IF_LAUNCH_ERROR(kernel_name) \
  RETURN_IF_CUDA_ERROR(cudaGetLastError(), "launch of " kernel_name)

#define RETURN_IF_CUBLAS_ERROR(expr, op)                                  \
  do {                                                                    \
    const cublasStatus_t recps_cublas_status_ = (expr);                   \
    if (recps_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                  \
      return ::recps::kernels::CublasStatusToStatus(recps_cublas_status_, \
                                                    (op));                \
    }                                                                     \
  } while (0)

inline cudaStream_t StreamOf(const ExecContext& ctx) {
  return static_cast<cudaStream_t>(ctx.cuda_stream);
}

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;
// Threads per block for the element-wise and row kernels.
constexpr int kBlockThreads = 256;
// Grid-stride kernels never launch more blocks than this; each thread then
// loops. Fixed (not derived from the SM count) so that results that depend
// on the work split are the same on every GPU.
constexpr int64_t kMaxGridBlocks = 65535;

__host__ __device__ constexpr int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Blocks of `items_per_block` covering `work_items` (at least 1, at most
// kMaxGridBlocks); kernels must grid-stride past the last block.
inline unsigned GridBlocks(int64_t work_items,
                           int64_t items_per_block = kBlockThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>(
      CeilDiv(work_items, items_per_block), 1, kMaxGridBlocks));
}

// Threads that share one row of `chunks` vector chunks: the smallest power
// of two covering the chunks, capped at a warp. Powers of two keep groups
// inside one warp, so groups can shuffle with `width`.
inline int ThreadsPerRow(int64_t chunks) {
  int t = 1;
  while (t < kWarpSize && t < chunks) t *= 2;
  return t;
}

inline bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Device scratch memory owned by one stream: allocated with cudaMallocAsync
// and released with cudaFreeAsync on the same stream, so it lives exactly as
// long as the work queued before the release.
class StreamBuffer {
 public:
  explicit StreamBuffer(cudaStream_t stream) : stream_(stream) {}
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  ~StreamBuffer() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }

  absl::Status Allocate(size_t bytes, const char* what);
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

// Carves one scratch allocation into 256-byte aligned arrays.
class ScratchLayout {
 public:
  size_t Add(size_t bytes) {
    const size_t at = total_;
    total_ += (bytes + 255) / 256 * 256;
    return at;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

// Sums `v` over each aligned group of `width` lanes (a power of two <= 32);
// every lane of the warp must call it. The butterfly order is fixed, so the
// result is deterministic (but not the sequential CPU order).
__device__ __forceinline__ float GroupSum(float v, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullWarpMask, v, offset, width);
  }
  return v;
}

// Vector loads of kVec consecutive row elements as floats, and stores of
// kVec floats. kVec is 1 (scalar), 4 (float4 of fp32) or 8 (uint4 of fp16);
// the vector forms need 16-byte aligned addresses.
template <int kVec>
__device__ __forceinline__ void LoadFloats(const float* p, float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = p[i];
  }
}

template <int kVec>
__device__ __forceinline__ void LoadFloats(const uint16_t* p,
                                           float (&v)[kVec]) {
  if constexpr (kVec == 8) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = HalfToFloat(static_cast<uint16_t>(words[i] & 0xffffu));
      v[2 * i + 1] = HalfToFloat(static_cast<uint16_t>(words[i] >> 16));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = HalfToFloat(p[i]);
  }
}

template <int kVec>
__device__ __forceinline__ void StoreFloats(float* p, const float (&v)[kVec]) {
  if constexpr (kVec % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kVec; i += 4) {
      *reinterpret_cast<float4*>(p + i) =
          make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) p[i] = v[i];
  }
}

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_CUDA_UTIL_CUH_

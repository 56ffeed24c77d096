// The CUDA backend of the device store (device_backend.h): per table one
// arena of fused rows and one hash index in GPU memory; per call, a lane
// from a fixed pool (a stream, a pinned host staging buffer and a device
// scratch buffer, allocated once), so concurrent lookups run on separate
// streams and no request allocates. A call copies its inputs into the
// lane's pinned buffer, then to the device, runs the kernels on the lane's
// stream, copies the results back and synchronises the stream; batches
// larger than a lane are cut into chunks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/half.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.cuh"
#include "kernels/dispatch.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/device_store/device_backend.h"

namespace recps::server::device_store {
namespace {

using kernels::CeilDiv;
using kernels::kBlockThreads;
using kernels::kMaxGridBlocks;

struct Entry {
  long long id;
  unsigned long long row_plus_one;  // 0: empty
};
static_assert(sizeof(Entry) == 16, "the host index's entry layout");

constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

unsigned Blocks(int64_t items) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min(CeilDiv(items, kBlockThreads), kMaxGridBlocks)));
}

__global__ void ProbeKernel(const Entry* __restrict__ index, uint64_t mask,
                            const int64_t* __restrict__ ids, int64_t n,
                            int64_t* __restrict__ rows) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const long long id = ids[i];
    int64_t row = -1;
    for (uint64_t h = Mix64(static_cast<uint64_t>(id)) & mask;;
         h = (h + 1) & mask) {
      const Entry e = index[h];
      if (e.row_plus_one == 0) break;
      if (e.id == id) {
        row = static_cast<int64_t>(e.row_plus_one) - 1;
        break;
      }
    }
    rows[i] = row;
  }
}

// ids are absent and distinct: a thread claims the first empty entry of
// its probe sequence (CAS on the row), then writes its id; no thread of
// the launch compares ids, and probes run only after it completes.
__global__ void InsertKernel(Entry* index, uint64_t mask,
                             const int64_t* __restrict__ ids,
                             const int64_t* __restrict__ rows,
                             int64_t row_base, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const long long id = ids[i];
    const unsigned long long row_plus_one =
        static_cast<unsigned long long>(rows != nullptr ? rows[i] : row_base + i) + 1;
    for (uint64_t h = Mix64(static_cast<uint64_t>(id)) & mask;;
         h = (h + 1) & mask) {
      if (atomicCAS(&index[h].row_plus_one, 0ull, row_plus_one) == 0ull) {
        index[h].id = id;
        break;
      }
    }
  }
}

// out[i] = the first `width4` float4s of row rows[i] (zeros for -1).
// Each thread keeps kUnroll loads in flight (all row numbers first, then
// all rows, then the stores); the launch gives each thread kUnroll items
// (GatherBlocks). kWidth4 > 0 is width4 known at compile time (the common
// dims 16, 32, 64, 128): the item -> row split is then a shift, not a
// 64-bit division, which is worth 4% of a 64k-row gather on an H200.
// Measured there (device_store_bench, 64k random rows of 64 floats): 1 and
// 2 loads in flight within 1%, 4 and 8 slower; the kernel over all 1M
// rows in one launch runs at 0.95 of a one-call cudaMemcpy, so what a
// 64k-row batch loses is the launch's ramp and tail, which a memcpy of
// the same bytes loses too.
constexpr int kGatherUnroll = 2;
template <int kUnroll, int kWidth4>
__global__ void GatherKernel(const float4* __restrict__ arena, int64_t stride4,
                             const int64_t* __restrict__ rows, int64_t n,
                             int64_t runtime_width4, float4* __restrict__ out) {
  const int64_t width4 = kWidth4 > 0 ? kWidth4 : runtime_width4;
  const int64_t total = n * width4;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (; k + (kUnroll - 1) * step < total; k += kUnroll * step) {
    int64_t at[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t item = k + u * step;
      const int64_t i = item / width4;
      const int64_t r = __ldg(rows + i);
      at[u] = r < 0 ? -1 : r * stride4 + (item - i * width4);
    }
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      v[u] = at[u] < 0 ? make_float4(0.f, 0.f, 0.f, 0.f) : __ldg(arena + at[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) out[k + u * step] = v[u];
  }
  for (; k < total; k += step) {
    const int64_t i = k / width4;
    const int64_t r = rows[i];
    out[k] = r < 0 ? make_float4(0.f, 0.f, 0.f, 0.f)
                   : arena[r * stride4 + (k - i * width4)];
  }
}

unsigned GatherBlocks(int64_t items, int unroll) {
  return Blocks(CeilDiv(items, int64_t{unroll}));
}

// The store's gather (GatherKernel) of n rows, `width4` float4s each, on
// `stream`; the common widths get their compile-time instance.
void LaunchGatherKernel(cudaStream_t stream, const float4* arena,
                        int64_t stride4, const int64_t* rows, int64_t n,
                        int64_t width4, float4* out) {
  const unsigned blocks = GatherBlocks(n * width4, kGatherUnroll);
  switch (width4) {
#define RECPS_GATHER_WIDTH(W)                                            \
  case W:                                                                \
    GatherKernel<kGatherUnroll, W><<<blocks, kBlockThreads, 0, stream>>>( \
        arena, stride4, rows, n, width4, out);                           \
    return;
    RECPS_GATHER_WIDTH(4)
    RECPS_GATHER_WIDTH(8)
    RECPS_GATHER_WIDTH(16)
    RECPS_GATHER_WIDTH(32)
#undef RECPS_GATHER_WIDTH
    default:
      GatherKernel<kGatherUnroll, 0><<<blocks, kBlockThreads, 0, stream>>>(
          arena, stride4, rows, n, width4, out);
  }
}

// The same for a width that is not a multiple of 4 floats.
__global__ void GatherScalarKernel(const float* __restrict__ arena,
                                   int64_t stride, const int64_t* __restrict__ rows,
                                   int64_t n, int64_t width,
                                   float* __restrict__ out) {
  const int64_t total = n * width;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / width;
    const int64_t j = k - i * width;
    const int64_t r = rows[i];
    out[k] = r < 0 ? 0.f : arena[r * stride + j];
  }
}

// out[i] = the dim 16-bit weights of row rows[i] widened to floats (zeros
// for -1); two weights (one 4-byte word) per thread when dim is even.
template <bool kFp16, bool kPairs>
__global__ void GatherWidenKernel(const uint32_t* __restrict__ arena,
                                  int64_t stride, const int64_t* __restrict__ rows,
                                  int64_t n, int dim, float* __restrict__ out) {
  const auto widen = [](uint32_t h) {
    return kFp16 ? HalfToFloat(static_cast<uint16_t>(h))
                 : Bf16ToFloat(static_cast<uint16_t>(h));
  };
  const int64_t per_row = kPairs ? dim / 2 : dim;
  const int64_t total = n * per_row;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / per_row;
    const int64_t j = k - i * per_row;
    const int64_t r = __ldg(rows + i);
    if constexpr (kPairs) {
      const uint32_t word = r < 0 ? 0u : __ldg(arena + r * stride + j);
      reinterpret_cast<float2*>(out + i * dim)[j] =
          make_float2(widen(word & 0xffffu), widen(word >> 16));
    } else {
      out[k] = r < 0 ? 0.f
                     : widen(reinterpret_cast<const uint16_t*>(arena + r * stride)[j]);
    }
  }
}

__global__ void ScatterKernel(float4* __restrict__ arena, int64_t stride4,
                              const int64_t* __restrict__ rows, int64_t n,
                              const float4* __restrict__ data) {
  const int64_t total = n * stride4;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / stride4;
    arena[rows[i] * stride4 + (k - i * stride4)] = data[k];
  }
}

__global__ void MoveKernel(float4* arena, int64_t stride4,
                           const int64_t* __restrict__ from,
                           const int64_t* __restrict__ to, int64_t n) {
  const int64_t total = n * stride4;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / stride4;
    const int64_t j = k - i * stride4;
    arena[to[i] * stride4 + j] = arena[from[i] * stride4 + j];
  }
}

struct Lane {
  cudaStream_t stream = nullptr;
  char* host = nullptr;  // pinned
  char* dev = nullptr;
  int64_t bytes = 0;
};

// The fixed pool of lanes; Acquire waits for a free one.
class LanePool {
 public:
  ~LanePool() {
    for (Lane& l : lanes_) {
      if (l.stream != nullptr) cudaStreamDestroy(l.stream);
      if (l.host != nullptr) cudaFreeHost(l.host);
      if (l.dev != nullptr) cudaFree(l.dev);
    }
  }
  absl::Status Init(int n, int64_t bytes) {
    lanes_.resize(n);
    for (Lane& l : lanes_) {
      l.bytes = bytes;
      RETURN_IF_CUDA_ERROR(
          cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking),
          "cudaStreamCreate");
      RETURN_IF_CUDA_ERROR(cudaMallocHost(&l.host, bytes),
                           "cudaMallocHost of a lane's staging buffer");
      RETURN_IF_CUDA_ERROR(cudaMalloc(&l.dev, bytes),
                           "cudaMalloc of a lane's scratch buffer");
    }
    absl::MutexLock lock(&mu_);
    for (Lane& l : lanes_) free_.push_back(&l);
    return absl::OkStatus();
  }
  Lane* Acquire() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::vector<Lane*>* f) { return !f->empty(); }, &free_));
    Lane* l = free_.back();
    free_.pop_back();
    return l;
  }
  void Release(Lane* l) {
    absl::MutexLock lock(&mu_);
    free_.push_back(l);
  }

 private:
  std::vector<Lane> lanes_;
  absl::Mutex mu_;
  std::vector<Lane*> free_ ABSL_GUARDED_BY(mu_);
};

class LaneHold {
 public:
  explicit LaneHold(LanePool& pool) : pool_(pool), lane_(pool.Acquire()) {}
  ~LaneHold() { pool_.Release(lane_); }
  Lane& operator*() const { return *lane_; }
  Lane* operator->() const { return lane_; }

 private:
  LanePool& pool_;
  Lane* const lane_;
};

// Ids per chunk when each id takes per_id bytes in `parts` aligned parts.
int64_t ChunkIds(const Lane& l, int64_t per_id, int parts) {
  return std::max<int64_t>(1, (l.bytes - parts * kAlign) / per_id);
}

class CudaTable final : public DeviceTable {
 public:
  CudaTable(int device, LanePool& lanes, const TableLayout& layout)
      : device_(device), lanes_(lanes), layout_(layout),
        mask_(static_cast<uint64_t>(layout.index_capacity) - 1) {}
  ~CudaTable() override {
    if (arena_ != nullptr) cudaFree(arena_);
    if (index_ != nullptr) cudaFree(index_);
  }

  absl::Status Init() {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    const size_t arena_bytes =
        static_cast<size_t>(layout_.capacity) * layout_.stride * sizeof(float);
    const size_t index_bytes =
        static_cast<size_t>(layout_.index_capacity) * sizeof(Entry);
    cudaError_t err = cudaMalloc(&arena_, arena_bytes);
    if (err == cudaSuccess) err = cudaMalloc(&index_, index_bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda:", device_, ": cannot allocate ", arena_bytes, " B of rows and ",
          index_bytes, " B of index: ", cudaGetErrorString(err)));
    }
    RETURN_IF_CUDA_ERROR(cudaMemset(arena_, 0, arena_bytes), "cudaMemset");
    RETURN_IF_CUDA_ERROR(cudaMemset(index_, 0, index_bytes), "cudaMemset");
    return absl::OkStatus();
  }

  absl::Status ProbeGather(absl::Span<const int64_t> ids, int64_t* rows,
                           float* out) const override {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    LaneHold lane(lanes_);
    const int dim = layout_.dim;
    const int64_t width = out == nullptr ? 0 : dim;
    const int64_t chunk = ChunkIds(*lane, 16 + 4 * width, 3);
    const int64_t n = static_cast<int64_t>(ids.size());
    for (int64_t lo = 0; lo < n; lo += chunk) {
      const int64_t m = std::min(chunk, n - lo);
      const int64_t ids_at = 0, rows_at = AlignUp(8 * m),
                    out_at = rows_at + AlignUp(8 * m);
      std::memcpy(lane->host + ids_at, ids.data() + lo, 8 * m);
      RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(lane->dev, lane->host, 8 * m,
                                           cudaMemcpyHostToDevice, lane->stream),
                           "cudaMemcpyAsync of ids");
      const auto* d_ids = reinterpret_cast<const int64_t*>(lane->dev + ids_at);
      auto* d_rows = reinterpret_cast<int64_t*>(lane->dev + rows_at);
      ProbeKernel<<<Blocks(m), kBlockThreads, 0, lane->stream>>>(
          index_, mask_, d_ids, m, d_rows);
      RETURN_IF_LAUNCH_ERROR("ProbeKernel");
      int64_t back = AlignUp(8 * m);
      if (width > 0) {
        RETURN_IF_ERROR(LaunchWeightsGather(
            lane->stream, d_rows, m, reinterpret_cast<float*>(lane->dev + out_at)));
        back += 4 * m * width;
      }
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(lane->host + rows_at, lane->dev + rows_at, back,
                          cudaMemcpyDeviceToHost, lane->stream),
          "cudaMemcpyAsync of rows");
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(lane->stream), "ProbeGather");
      std::memcpy(rows + lo, lane->host + rows_at, 8 * m);
      if (width > 0) {
        std::memcpy(out + lo * width, lane->host + out_at, 4 * m * width);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Insert(absl::Span<const int64_t> ids,
                      absl::Span<const int64_t> rows) override {
    return InsertRows(ids, rows.data(), 0);
  }

  absl::Status RebuildIndex(absl::Span<const int64_t>,
                            absl::Span<const int64_t> new_ids) override {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    {
      LaneHold lane(lanes_);
      RETURN_IF_CUDA_ERROR(
          cudaMemsetAsync(index_, 0, layout_.index_capacity * sizeof(Entry),
                          lane->stream),
          "cudaMemsetAsync of the index");
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(lane->stream), "RebuildIndex");
    }
    return InsertRows(new_ids, nullptr, 0);
  }

  absl::Status ReadRows(absl::Span<const int64_t> rows,
                        float* out) const override {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    LaneHold lane(lanes_);
    const int64_t stride = layout_.stride;
    const int64_t chunk = ChunkIds(*lane, 8 + 4 * stride, 2);
    const int64_t n = static_cast<int64_t>(rows.size());
    for (int64_t lo = 0; lo < n; lo += chunk) {
      const int64_t m = std::min(chunk, n - lo);
      const int64_t out_at = AlignUp(8 * m);
      std::memcpy(lane->host, rows.data() + lo, 8 * m);
      RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(lane->dev, lane->host, 8 * m,
                                           cudaMemcpyHostToDevice, lane->stream),
                           "cudaMemcpyAsync of rows");
      RETURN_IF_ERROR(LaunchGather(lane->stream,
                                   reinterpret_cast<const int64_t*>(lane->dev),
                                   m, stride,
                                   reinterpret_cast<float*>(lane->dev + out_at)));
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(lane->host + out_at, lane->dev + out_at, 4 * m * stride,
                          cudaMemcpyDeviceToHost, lane->stream),
          "cudaMemcpyAsync of rows");
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(lane->stream), "ReadRows");
      std::memcpy(out + lo * stride, lane->host + out_at, 4 * m * stride);
    }
    return absl::OkStatus();
  }

  absl::Status WriteRows(absl::Span<const int64_t> rows,
                         const float* data) override {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    LaneHold lane(lanes_);
    const int64_t stride = layout_.stride;
    const int64_t chunk = ChunkIds(*lane, 8 + 4 * stride, 2);
    const int64_t n = static_cast<int64_t>(rows.size());
    for (int64_t lo = 0; lo < n; lo += chunk) {
      const int64_t m = std::min(chunk, n - lo);
      const int64_t data_at = AlignUp(8 * m);
      std::memcpy(lane->host, rows.data() + lo, 8 * m);
      std::memcpy(lane->host + data_at, data + lo * stride, 4 * m * stride);
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(lane->dev, lane->host, data_at + 4 * m * stride,
                          cudaMemcpyHostToDevice, lane->stream),
          "cudaMemcpyAsync of rows");
      ScatterKernel<<<Blocks(m * stride / 4), kBlockThreads, 0, lane->stream>>>(
          reinterpret_cast<float4*>(arena_), stride / 4,
          reinterpret_cast<const int64_t*>(lane->dev), m,
          reinterpret_cast<const float4*>(lane->dev + data_at));
      RETURN_IF_LAUNCH_ERROR("ScatterKernel");
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(lane->stream), "WriteRows");
    }
    return absl::OkStatus();
  }

  absl::Status MoveRows(absl::Span<const int64_t> from,
                        absl::Span<const int64_t> to) override {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    LaneHold lane(lanes_);
    const int64_t stride = layout_.stride;
    const int64_t chunk = ChunkIds(*lane, 16, 2);
    const int64_t n = static_cast<int64_t>(from.size());
    for (int64_t lo = 0; lo < n; lo += chunk) {
      const int64_t m = std::min(chunk, n - lo);
      const int64_t to_at = AlignUp(8 * m);
      std::memcpy(lane->host, from.data() + lo, 8 * m);
      std::memcpy(lane->host + to_at, to.data() + lo, 8 * m);
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(lane->dev, lane->host, to_at + 8 * m,
                          cudaMemcpyHostToDevice, lane->stream),
          "cudaMemcpyAsync of moves");
      MoveKernel<<<Blocks(m * stride / 4), kBlockThreads, 0, lane->stream>>>(
          reinterpret_cast<float4*>(arena_), stride / 4,
          reinterpret_cast<const int64_t*>(lane->dev),
          reinterpret_cast<const int64_t*>(lane->dev + to_at), m);
      RETURN_IF_LAUNCH_ERROR("MoveKernel");
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(lane->stream), "MoveRows");
    }
    return absl::OkStatus();
  }

  absl::Status Update(absl::Span<const int64_t> rows, const float* grads,
                      const OptimizerParams& optimizer) override {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    LaneHold lane(lanes_);
    const int dim = layout_.dim;
    const int64_t chunk = ChunkIds(*lane, 8 + 4 * dim, 2);
    const int64_t n = static_cast<int64_t>(rows.size());
    for (int64_t lo = 0; lo < n; lo += chunk) {
      const int64_t m = std::min(chunk, n - lo);
      const int64_t grads_at = AlignUp(8 * m);
      std::memcpy(lane->host, rows.data() + lo, 8 * m);
      std::memcpy(lane->host + grads_at, grads + lo * dim, 4 * m * dim);
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(lane->dev, lane->host, grads_at + 4 * m * dim,
                          cudaMemcpyHostToDevice, lane->stream),
          "cudaMemcpyAsync of gradients");
      kernels::FusedUpdateArgs args;
      args.rows = arena_;
      args.precision = layout_.precision;
      args.stochastic_rounding = layout_.stochastic_rounding;
      args.num_rows = layout_.capacity;
      args.row_stride = layout_.stride;
      args.dim = dim;
      args.row_indices = reinterpret_cast<const int64_t*>(lane->dev);
      args.num_updates = m;
      args.grads = reinterpret_cast<const float*>(lane->dev + grads_at);
      args.optimizer = optimizer;
      kernels::ExecContext ctx;
      ctx.device = kernels::Device::kCuda;
      ctx.cuda_device = device_;
      ctx.cuda_stream = lane->stream;
      RETURN_IF_ERROR(kernels::FusedOptimizerUpdate(args, ctx));
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(lane->stream), "Update");
    }
    return absl::OkStatus();
  }

 private:
  // The dim weights of each row as floats (ProbeGather's out).
  absl::Status LaunchWeightsGather(cudaStream_t stream, const int64_t* d_rows,
                                   int64_t m, float* d_out) const {
    if (layout_.precision == RowPrecision::kFp32) {
      return LaunchGather(stream, d_rows, m, layout_.dim, d_out);
    }
    const bool fp16 = layout_.precision == RowPrecision::kFp16;
    const bool pairs = layout_.dim % 2 == 0;
    const auto* arena = reinterpret_cast<const uint32_t*>(arena_);
    const unsigned blocks = Blocks(m * (pairs ? layout_.dim / 2 : layout_.dim));
    if (fp16 && pairs) {
      GatherWidenKernel<true, true><<<blocks, kBlockThreads, 0, stream>>>(
          arena, layout_.stride, d_rows, m, layout_.dim, d_out);
    } else if (fp16) {
      GatherWidenKernel<true, false><<<blocks, kBlockThreads, 0, stream>>>(
          arena, layout_.stride, d_rows, m, layout_.dim, d_out);
    } else if (pairs) {
      GatherWidenKernel<false, true><<<blocks, kBlockThreads, 0, stream>>>(
          arena, layout_.stride, d_rows, m, layout_.dim, d_out);
    } else {
      GatherWidenKernel<false, false><<<blocks, kBlockThreads, 0, stream>>>(
          arena, layout_.stride, d_rows, m, layout_.dim, d_out);
    }
    RETURN_IF_LAUNCH_ERROR("GatherWidenKernel");
    return absl::OkStatus();
  }

  // The first `width` words of each row, as they are.
  absl::Status LaunchGather(cudaStream_t stream, const int64_t* d_rows,
                            int64_t m, int64_t width, float* d_out) const {
    if (width % 4 == 0) {
      LaunchGatherKernel(stream, reinterpret_cast<const float4*>(arena_),
                         layout_.stride / 4, d_rows, m, width / 4,
                         reinterpret_cast<float4*>(d_out));
      RETURN_IF_LAUNCH_ERROR("GatherKernel");
    } else {
      GatherScalarKernel<<<Blocks(m * width), kBlockThreads, 0, stream>>>(
          arena_, layout_.stride, d_rows, m, width, d_out);
      RETURN_IF_LAUNCH_ERROR("GatherScalarKernel");
    }
    return absl::OkStatus();
  }

  // rows == nullptr: ids[k] gets row row_base + lo + k.
  absl::Status InsertRows(absl::Span<const int64_t> ids, const int64_t* rows,
                          int64_t row_base) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    LaneHold lane(lanes_);
    const int64_t chunk = ChunkIds(*lane, 16, 2);
    const int64_t n = static_cast<int64_t>(ids.size());
    for (int64_t lo = 0; lo < n; lo += chunk) {
      const int64_t m = std::min(chunk, n - lo);
      const int64_t rows_at = AlignUp(8 * m);
      std::memcpy(lane->host, ids.data() + lo, 8 * m);
      int64_t bytes = 8 * m;
      if (rows != nullptr) {
        std::memcpy(lane->host + rows_at, rows + lo, 8 * m);
        bytes = rows_at + 8 * m;
      }
      RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(lane->dev, lane->host, bytes,
                                           cudaMemcpyHostToDevice, lane->stream),
                           "cudaMemcpyAsync of ids");
      InsertKernel<<<Blocks(m), kBlockThreads, 0, lane->stream>>>(
          index_, mask_, reinterpret_cast<const int64_t*>(lane->dev),
          rows != nullptr ? reinterpret_cast<const int64_t*>(lane->dev + rows_at)
                          : nullptr,
          row_base + lo, m);
      RETURN_IF_LAUNCH_ERROR("InsertKernel");
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(lane->stream), "Insert");
    }
    return absl::OkStatus();
  }

  const int device_;
  LanePool& lanes_;
  const TableLayout layout_;
  const uint64_t mask_;
  float* arena_ = nullptr;
  Entry* index_ = nullptr;
};

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  absl::Status Init(int lanes, int64_t lane_bytes) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    return lanes_.Init(lanes, lane_bytes);
  }
  std::string name() const override { return absl::StrCat("cuda:", device_); }
  absl::StatusOr<std::unique_ptr<DeviceTable>> CreateTable(
      const TableLayout& layout) override {
    if (layout.stride % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda store: row stride ", layout.stride, " is not a multiple of 4"));
    }
    auto t = std::make_unique<CudaTable>(device_, lanes_, layout);
    RETURN_IF_ERROR(t->Init());
    return std::unique_ptr<DeviceTable>(std::move(t));
  }

 private:
  const int device_;
  LanePool lanes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCudaBackend(
    int device, int lanes, int64_t lane_bytes) {
  RETURN_IF_ERROR(kernels::CheckCudaDevice(device));
  auto backend = std::make_unique<CudaBackend>(device);
  if (absl::Status s = backend->Init(lanes, lane_bytes); !s.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda:", device, ": stream buffers: ", s.message()));
  }
  return std::unique_ptr<DeviceBackend>(std::move(backend));
}

int64_t CudaBackendScratchBytes(int lanes, int64_t lane_bytes) {
  return int64_t{lanes} * lane_bytes;
}

absl::StatusOr<GatherBandwidth> MeasureGatherBandwidth(int device,
                                                       int64_t num_rows,
                                                       int dim, int64_t batch,
                                                       int iters) {
  if (dim % 4 != 0 || num_rows < 1 || batch < 1 || batch > num_rows ||
      iters < 1) {
    return absl::InvalidArgumentError(
        "gather benchmark: dim must be a multiple of 4, 1 <= batch <= rows");
  }
  RETURN_IF_ERROR(kernels::CheckCudaDevice(device));
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "cudaSetDevice");
  GatherBandwidth r;
  int l2 = 0;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  r.l2_bytes = l2;
  // Rotate over `sets` disjoint batches (their outputs side by side) so that
  // one run's working set is far larger than L2: a repeated 64k-row batch
  // (16 MiB of rows, 16 MiB out) stays in an H200's 60 MiB L2, and the
  // anchor then measures the cache, not HBM.
  const int64_t sets = std::max<int64_t>(1, std::min<int64_t>(num_rows / batch, 64));
  r.sets = sets;
  // Adagrad rows: weights and their sums of squares side by side.
  const int64_t stride =
      FusedRowStride(OptimizerKind::kAdagrad, dim);
  float* arena = nullptr;
  float* out = nullptr;
  float* copy = nullptr;
  int64_t* rows = nullptr;
  const size_t batch_bytes = static_cast<size_t>(batch) * dim * sizeof(float);
  const size_t out_bytes = batch_bytes * sets;
  r.working_set_bytes = 2 * out_bytes;
  auto release = absl::MakeCleanup([&] {
    cudaFree(arena);
    cudaFree(out);
    cudaFree(copy);
    cudaFree(rows);
  });
  const size_t arena_bytes = static_cast<size_t>(num_rows) * stride * sizeof(float);
  RETURN_IF_CUDA_ERROR(cudaMalloc(&arena, arena_bytes), "cudaMalloc");
  RETURN_IF_CUDA_ERROR(cudaMemset(arena, 0, arena_bytes), "cudaMemset");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&out, out_bytes), "cudaMalloc");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&copy, out_bytes), "cudaMalloc");
  RETURN_IF_CUDA_ERROR(cudaMemset(out, 0, out_bytes), "cudaMemset");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&rows, sets * batch * sizeof(int64_t)),
                       "cudaMalloc");
  // Distinct random rows (the update requires them distinct within a batch):
  // a partial Fisher-Yates shuffle of [0, num_rows), cut into the sets.
  std::vector<int64_t> perm(num_rows);
  for (int64_t i = 0; i < num_rows; ++i) perm[i] = i;
  uint64_t x = 42;
  for (int64_t i = 0; i < sets * batch; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const int64_t j = i + static_cast<int64_t>((x >> 17) % static_cast<uint64_t>(num_rows - i));
    std::swap(perm[i], perm[j]);
  }
  RETURN_IF_CUDA_ERROR(cudaMemcpy(rows, perm.data(), sets * batch * sizeof(int64_t),
                                  cudaMemcpyHostToDevice),
                       "cudaMemcpy");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  // One timed run covers every set once; the figure is the mean of `iters`.
  auto time = [&](auto&& launch) -> double {
    launch();  // warm-up
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms / iters;
  };
  const auto* arena4 = reinterpret_cast<const float4*>(arena);
  auto* out4 = reinterpret_cast<float4*>(out);
  // Per batch, as the store runs it: one launch (one call) per batch.
  r.gather_ms = time([&] {
    for (int64_t k = 0; k < sets; ++k) {
      LaunchGatherKernel(nullptr, arena4, stride / 4, rows + k * batch, batch,
                         dim / 4, out4 + k * batch * (dim / 4));
    }
  });
  r.memcpy_ms = time([&] {
    for (int64_t k = 0; k < sets; ++k) {
      cudaMemcpyAsync(reinterpret_cast<char*>(copy) + k * batch_bytes,
                      reinterpret_cast<const char*>(out) + k * batch_bytes,
                      batch_bytes, cudaMemcpyDeviceToDevice);
    }
  });
  // The same bytes in one launch (one call): the kernel's and the copy's
  // bandwidth without the per-launch ramp and tail.
  r.one_launch_gather_ms = time([&] {
    LaunchGatherKernel(nullptr, arena4, stride / 4, rows, sets * batch, dim / 4,
                       out4);
  });
  r.one_call_memcpy_ms = time([&] {
    cudaMemcpyAsync(copy, out, out_bytes, cudaMemcpyDeviceToDevice);
  });
  kernels::FusedUpdateArgs args;
  args.rows = arena;
  args.num_rows = num_rows;
  args.row_stride = stride;
  args.dim = dim;
  args.num_updates = batch;
  args.optimizer.kind = OptimizerKind::kAdagrad;
  args.optimizer.learning_rate = 0.01f;
  kernels::ExecContext ctx;
  ctx.device = kernels::Device::kCuda;
  ctx.cuda_device = device;
  absl::Status update_status;
  r.update_ms = time([&] {
    for (int64_t k = 0; k < sets; ++k) {
      args.row_indices = rows + k * batch;
      args.grads = out + k * batch * dim;  // zeros: the rows stay finite
      absl::Status s = kernels::FusedOptimizerUpdate(args, ctx);
      if (!s.ok() && update_status.ok()) update_status = s;
    }
  });
  const cudaError_t err = cudaGetLastError();
  // Bytes moved per run: the gather reads and writes out_bytes; the copy
  // reads and writes out_bytes; the Adagrad update reads and writes weights
  // and sums and reads the gradient (5 x out_bytes).
  auto gbps = [&](double bytes, double ms) { return bytes / (ms * 1e6); };
  r.gather_gbps = gbps(2.0 * out_bytes, r.gather_ms);
  r.memcpy_gbps = gbps(2.0 * out_bytes, r.memcpy_ms);
  r.update_gbps = gbps(5.0 * out_bytes, r.update_ms);
  r.one_launch_gather_gbps = gbps(2.0 * out_bytes, r.one_launch_gather_ms);
  r.one_call_memcpy_gbps = gbps(2.0 * out_bytes, r.one_call_memcpy_ms);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  RETURN_IF_ERROR(update_status);
  RETURN_IF_CUDA_ERROR(err, "gather benchmark");
  return r;
}

}  // namespace recps::server::device_store

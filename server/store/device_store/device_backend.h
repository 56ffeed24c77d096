// The batched device operations the device store (device_store.h) runs its
// tables on. Two implementations with the same row layout and the same
// algorithms: the CUDA backend (cuda_backend.cu: arenas and hash indexes in
// GPU memory) and its CPU twin (cpu_twin_backend.cc: the same in host
// memory), so that every path of the store is tested on machines without a
// GPU and the CUDA one is checked against it where a GPU is present.
//
// A table is one arena of `capacity` stored rows (kernels/
// embedding_optimizer.h: weights in the table's precision, fp32 optimizer
// state, padding; `stride` 4-byte words each) and one id -> row hash index: open addressing with linear probing
// over {id, row + 1} entries (0: empty), home Mix64(id) & mask, at most 7/10
// full (index_capacity = IdIndex::CapacityForRows(capacity)), never rehashed.
//
// Thread-safety: the device store calls ProbeGather and ReadRows
// concurrently (its tables' reader lock) and everything else alone (the
// writer lock). Every call is synchronous: when it returns, its results are
// in host memory and its writes are done.
#ifndef RECPS_SERVER_STORE_DEVICE_STORE_DEVICE_BACKEND_H_
#define RECPS_SERVER_STORE_DEVICE_STORE_DEVICE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/embedding_optimizer.h"
#include "kernels/optimizer.h"

namespace recps::server::device_store {

struct TableLayout {
  int64_t capacity = 0;        // rows the arena holds
  int64_t stride = 0;          // 4-byte words per stored row
  int dim = 0;                 // weights per row
  int64_t index_capacity = 0;  // index entries (a power of two)
  // How the weights are stored; the update rounds 16-bit weights to
  // nearest even or (stochastic_rounding) stochastically.
  RowPrecision precision = RowPrecision::kFp32;
  bool stochastic_rounding = false;
};

class DeviceTable {
 public:
  virtual ~DeviceTable() = default;

  // rows[p] = the row of ids[p], or -1 when it has none; when out is not
  // null, also the `dim` weights of each found row as floats (16-bit ones
  // widened) to out + p * dim (ids without a row: zeros).
  virtual absl::Status ProbeGather(absl::Span<const int64_t> ids,
                                   int64_t* rows, float* out) const = 0;
  // Adds ids[p] -> rows[p]. REQUIRES: ids distinct and absent from the
  // index, rows distinct and < capacity.
  virtual absl::Status Insert(absl::Span<const int64_t> ids,
                              absl::Span<const int64_t> rows) = 0;
  // Makes the index map new_ids[r] -> r (r < new_ids.size()) and nothing
  // else; old_ids are every id it maps now (the CPU twin clears only their
  // entries, so that a huge reserved index is never touched whole).
  virtual absl::Status RebuildIndex(absl::Span<const int64_t> old_ids,
                                    absl::Span<const int64_t> new_ids) = 0;
  // Whole stored rows (stride words each) of `rows` to out, in order.
  virtual absl::Status ReadRows(absl::Span<const int64_t> rows,
                                float* out) const = 0;
  // Overwrites whole stored rows from data (rows.size() x stride words).
  virtual absl::Status WriteRows(absl::Span<const int64_t> rows,
                                 const float* data) = 0;
  // Row to[k] = row from[k]. REQUIRES: no row is both a source and a
  // destination.
  virtual absl::Status MoveRows(absl::Span<const int64_t> from,
                                absl::Span<const int64_t> to) = 0;
  // The fused optimizer update (kernels/dispatch.h FusedOptimizerUpdate):
  // gradient row k (dim floats of grads) applied to rows[k].
  // REQUIRES: rows distinct.
  virtual absl::Status Update(absl::Span<const int64_t> rows,
                              const float* grads,
                              const OptimizerParams& optimizer) = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // "cpu-twin" or "cuda:N".
  virtual std::string name() const = 0;
  // A table with zeroed arena and an empty index; RESOURCE_EXHAUSTED when
  // the memory cannot be had.
  virtual absl::StatusOr<std::unique_ptr<DeviceTable>> CreateTable(
      const TableLayout& layout) = 0;
};

// The host-memory twin of the CUDA backend.
std::unique_ptr<DeviceBackend> CreateCpuTwinBackend();

#if defined(RECPS_HAVE_CUDA)
// The CUDA backend on GPU `device`: a pool of `lanes` streams, each with a
// pinned host staging buffer and a device scratch buffer of `lane_bytes`,
// allocated here and reused by every call. FAILED_PRECONDITION when the GPU
// cannot be used, RESOURCE_EXHAUSTED when the buffers cannot be had.
absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCudaBackend(
    int device, int lanes, int64_t lane_bytes);
// Bytes the CUDA backend's lanes take in GPU memory.
int64_t CudaBackendScratchBytes(int lanes, int64_t lane_bytes);

// The physical anchor of the store's lookups and pushes (bench/): the
// backend's row-gather kernel over batches of `batch` distinct random rows
// of a num_rows x dim Adagrad table, and the fused Adagrad update of those
// rows, against a device-to-device cudaMemcpy of the gathered bytes, each
// timed with events over `iters` runs. A run rotates over `sets` disjoint
// batches (up to 64, as many as the table holds) so that the bytes it
// touches outgrow L2 and all figures are HBM's. GB/s count bytes read +
// written.
// REQUIRES: dim % 4 == 0, batch <= num_rows.
struct GatherBandwidth {
  // Per batch, as the store runs them: one gather launch, one update, one
  // memcpy call per batch. The goals compare these.
  double gather_ms = 0, memcpy_ms = 0, update_ms = 0;
  double gather_gbps = 0, memcpy_gbps = 0, update_gbps = 0;
  // All sets' rows in one gather launch, and one memcpy call of all the
  // bytes: the bandwidth without each launch's ramp and tail, which a
  // 64k-row batch (a few microseconds of work) pays in full.
  double one_launch_gather_ms = 0, one_call_memcpy_ms = 0;
  double one_launch_gather_gbps = 0, one_call_memcpy_gbps = 0;
  int64_t sets = 0;               // batches per run
  int64_t working_set_bytes = 0;  // the memcpy's source + destination
  int64_t l2_bytes = 0;           // the GPU's L2, for comparison
};
absl::StatusOr<GatherBandwidth> MeasureGatherBandwidth(int device,
                                                       int64_t num_rows,
                                                       int dim, int64_t batch,
                                                       int iters);
#endif

// The lane pool of the CUDA backend the store uses.
constexpr int kCudaLanes = 4;
constexpr int64_t kCudaLaneBytes = int64_t{32} << 20;

}  // namespace recps::server::device_store

#endif  // RECPS_SERVER_STORE_DEVICE_STORE_DEVICE_BACKEND_H_

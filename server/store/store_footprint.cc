#include "server/store/store_footprint.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda_util.h"
#include "server/store/id_index.h"

namespace recps::server {

int64_t HostRowBytes(OptimizerKind kind, int dim,
                     RowPrecision precision) {
  return FusedRowStride(kind, dim, precision) *
         static_cast<int64_t>(sizeof(float));
}

int64_t HostIndexBytesPerSlot() {
  return static_cast<int64_t>(sizeof(IdIndex) + sizeof(int64_t));
}

int64_t HostIndexAllocBytes(int64_t capacity) {
  return capacity <= 0 ? 0 : IdIndex::AllocBytes(capacity);
}

int64_t HostRowIdBytes(int64_t rows) {
  return rows <= 0 ? 0 : rows * static_cast<int64_t>(sizeof(int64_t));
}

int64_t ExpectedFixedRows(int64_t num_rows, double share) {
  if (num_rows <= 0 || !(share > 0)) return 0;
  return std::min<int64_t>(
      num_rows, static_cast<int64_t>(std::ceil(static_cast<double>(num_rows) *
                                               std::min(1.0, share) * 1.02)) + 64);
}

int64_t HostDenseIndexBytes(int64_t num_rows) {
  return num_rows > 0 && num_rows <= kHostDenseIndexMaxRows
             ? num_rows * static_cast<int64_t>(sizeof(uint32_t))
             : 0;
}

int64_t HostIndexBytesForRows(int64_t rows) {
  return HostIndexAllocBytes(IdIndex::CapacityForRows(rows));
}

int64_t DeviceStoreMemoryBytes(int cuda_device) {
#if defined(RECPS_HAVE_CUDA)
  int64_t free_bytes = 0, total_bytes = 0;
  if (kernels::CudaMemInfo(cuda_device, &free_bytes, &total_bytes).ok()) return total_bytes;
#else
  (void)cuda_device;
#endif
  return 0;
}

}  // namespace recps::server

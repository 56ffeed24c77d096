// The device-resident EmbeddingStore (embedding_store.h): rows live in a
// DeviceBackend (device_backend.h), in GPU memory for --device=cuda:N, and
// in host memory for the CPU twin that tests run everywhere.
//
// Per table: the backend's arena of fused rows and its hash index (lookups
// and pushes probe and gather there in one batched call), plus host-side
// bookkeeping that only writers touch: the id and generation of every row,
// and each slot's rows (for slot export and DropSlot). One reader-writer
// lock per table: lookups whose rows all exist, ReadRows and exports are
// readers (they run concurrently, on the CUDA backend each on its own
// stream); row creation, pushes, imports, drops and generation bumps are
// writers. A push therefore never overlaps a lookup of the same table,
// so a lookup sees every row whole.
//
// Differences from the host store: the arena is allocated whole at start
// (capacity rows: num_rows, or StoreOptions.max_rows_per_table for a
// dynamic table), GPU memory being committed at allocation; a lookup or
// push that needs more new rows than are free creates none (the host store
// creates rows until it is full); DropSlot rebuilds the table's index.
#ifndef RECPS_SERVER_STORE_DEVICE_STORE_DEVICE_STORE_H_
#define RECPS_SERVER_STORE_DEVICE_STORE_DEVICE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/table_spec.h"
#include "server/store/device_store/device_backend.h"
#include "server/store/embedding_store.h"

namespace recps::server {

// A device store over `backend`. INVALID_ARGUMENT for a bad spec (as
// CreateHostEmbeddingStore), RESOURCE_EXHAUSTED when the backend cannot
// allocate a table.
absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateDeviceEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options,
    std::unique_ptr<device_store::DeviceBackend> backend);

// The device store over the CPU twin backend: the GPU store's code paths in
// host memory. For tests and benchmarks; not a --device choice (the host
// store is faster on a CPU).
absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateCpuTwinEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options);

// What a device store of `tables` takes in device memory.
struct DeviceFootprint {
  struct Table {
    std::string name;
    int64_t rows = 0;        // arena capacity
    int64_t row_bytes = 0;   // padded fused row
    int64_t index_bytes = 0;
  };
  std::vector<Table> tables;
  int64_t scratch_bytes = 0;  // the backend's per-stream buffers
  int64_t total_bytes = 0;
};
// Rows x padded fused row bytes + index per table (the host store's
// index entry layout and load, store_footprint.h), plus scratch_bytes.
DeviceFootprint ComputeDeviceFootprint(
    const std::vector<config::TableSpec>& tables, const StoreOptions& options,
    int64_t scratch_bytes);
// OK when the footprint fits in free_bytes; else RESOURCE_EXHAUSTED naming
// the device, the biggest table and what to lower, in the planner's words
// ("does not fit: it needs ...").
absl::Status CheckDeviceFits(const DeviceFootprint& footprint,
                             const std::string& device, int64_t free_bytes,
                             int64_t total_bytes);

}  // namespace recps::server

#endif  // RECPS_SERVER_STORE_DEVICE_STORE_DEVICE_STORE_H_

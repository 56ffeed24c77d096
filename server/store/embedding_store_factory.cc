#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda_util.h"
#include "server/store/device_store/device_backend.h"
#include "server/store/device_store/device_store.h"
#include "server/store/embedding_store.h"

namespace recps::server {
namespace {

// The GPU store: the device must be usable and the whole store (arenas are
// allocated up front) must fit in its free memory, checked before any
// allocation so that a store too big fails at start with the footprint.
absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateCudaStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options) {
  RETURN_IF_ERROR(kernels::CheckCudaDevice(options.cuda_device));
#if defined(RECPS_HAVE_CUDA)
  const std::string device =
      kernels::DeviceName(options.device, options.cuda_device);
  const DeviceFootprint footprint = ComputeDeviceFootprint(
      tables, options,
      device_store::CudaBackendScratchBytes(device_store::kCudaLanes,
                                            device_store::kCudaLaneBytes));
  int64_t free_bytes = 0, total_bytes = 0;
  RETURN_IF_ERROR(
      kernels::CudaMemInfo(options.cuda_device, &free_bytes, &total_bytes));
  RETURN_IF_ERROR(CheckDeviceFits(footprint, device, free_bytes, total_bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<device_store::DeviceBackend> backend,
                   device_store::CreateCudaBackend(options.cuda_device,
                                                   device_store::kCudaLanes,
                                                   device_store::kCudaLaneBytes));
  return CreateDeviceEmbeddingStore(std::move(tables), options,
                                    std::move(backend));
#else
  // CheckCudaDevice refuses every device in a build without CUDA.
  (void)tables;
  return absl::InternalError("unreachable: CUDA store without CUDA");
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options) {
  switch (options.device) {
    case kernels::Device::kCpu:
      return CreateHostEmbeddingStore(std::move(tables), options);
    case kernels::Device::kCuda:
      return CreateCudaStore(std::move(tables), options);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "store: unknown device ", static_cast<int>(options.device)));
}

}  // namespace recps::server

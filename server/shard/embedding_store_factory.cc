#include "absl/strings/str_cat.h"
#include "server/shard/embedding_store.h"

namespace recps::server {

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateEmbeddingStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options) {
  switch (options.device) {
    case kernels::Device::kCpu:
      return CreateHostEmbeddingStore(std::move(tables), options);
    case kernels::Device::kCuda:
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", kernels::DeviceName(options.device, options.cuda_device),
          ": shard servers keep their rows in host memory only so far (the "
          "GPU-resident store is not built yet); run with --device=cpu"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "store: unknown device ", static_cast<int>(options.device)));
}

}  // namespace recps::server

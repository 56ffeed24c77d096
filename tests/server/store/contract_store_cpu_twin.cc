// The contract tests on the device store over its CPU twin
// (tests/server/store/contract_store.h).
#include "server/store/device_store/device_store.h"
#include "tests/server/store/contract_store.h"

namespace recps::server {

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateContractStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options) {
  return CreateCpuTwinEmbeddingStore(std::move(tables), options);
}

bool ContractStoreIsHostStore() { return false; }

}  // namespace recps::server

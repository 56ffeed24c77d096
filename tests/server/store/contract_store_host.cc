// The contract tests on the host store (tests/server/store/contract_store.h).
#include "tests/server/store/contract_store.h"

namespace recps::server {

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateContractStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options) {
  return CreateHostEmbeddingStore(std::move(tables), options);
}

bool ContractStoreIsHostStore() { return true; }

}  // namespace recps::server

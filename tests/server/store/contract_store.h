// The store the store's contract tests run on (host_embedding_store_test,
// host_store_16bit_test, slot_transfer_test, slot_drop_test,
// store_snapshot_test): a link-time seam. Their host binaries link
// contract_store_host.cc (the host store); recps_device_store_contract_test
// links contract_store_cpu_twin.cc (the device store over its CPU twin), so
// the same tests check both implementations of EmbeddingStore.
#ifndef RECPS_TESTS_SERVER_SHARD_CONTRACT_STORE_H_
#define RECPS_TESTS_SERVER_SHARD_CONTRACT_STORE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/table_spec.h"
#include "server/store/embedding_store.h"

namespace recps::server {

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateContractStore(
    std::vector<config::TableSpec> tables, const StoreOptions& options);

// Whether the store under test is the host store. The few tests of its own
// internals (a dense id map, an index that grows, memory given back on a
// drop, committed fixed tables) skip on the device store, whose arena and
// index are allocated whole at start.
bool ContractStoreIsHostStore();

}  // namespace recps::server

#endif  // RECPS_TESTS_SERVER_SHARD_CONTRACT_STORE_H_

// The store a shard server's parts work on, for their unit tests: a
// LayeredStore over a host store of `tables`.
#ifndef RECPS_TESTS_TESTING_TEST_STORE_H_
#define RECPS_TESTS_TESTING_TEST_STORE_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/config/table_spec.h"
#include "gtest/gtest.h"
#include "server/store/embedding_store.h"
#include "server/store/layered_store.h"

namespace recps::testing {

// Null (and a test failure) when the host store refuses `tables`.
inline std::unique_ptr<server::LayeredStore> TestLayeredStore(
    std::vector<config::TableSpec> tables, uint32_t num_slots, uint64_t seed = 0) {
  server::StoreOptions o;
  o.seed = seed;
  o.num_slots = num_slots;
  o.max_rows_per_table = 1 << 16;
  auto base = server::CreateHostEmbeddingStore(std::move(tables), o);
  EXPECT_TRUE(base.ok()) << base.status();
  if (!base.ok()) return nullptr;
  return std::make_unique<server::LayeredStore>(*std::move(base));
}

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_TEST_STORE_H_

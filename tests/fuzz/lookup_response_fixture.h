// The client-side batch the lookup response fuzzer answers: three tables
// (one split column-wise over the two servers), ids with repeats. Shared
// with the corpus generator, which writes valid responses for it.
#ifndef RECPS_TESTS_FUZZ_LOOKUP_RESPONSE_FIXTURE_H_
#define RECPS_TESTS_FUZZ_LOOKUP_RESPONSE_FIXTURE_H_

#include <cstdint>
#include <vector>

#include "client/routed_batch.h"
#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "tests/testing/column_groups.h"

namespace recps::fuzz {

struct ResponseFixture {
  ResponseFixture() {
    v1::ShardMap proto = ShardMap::Uniform(1, 16, {"a:1", "b:2"}).ToProto();
    testing::AddColumnGroups(&proto, "wide", {0, 3, 8}, {1, 0});
    map = *ShardMap::FromProto(proto);
    for (const auto& t : tables) keys.push_back(StableNameKey(t.name));
  }
  // Prepares and routes `batch` into the three output arrays.
  void Prepare(client::internal::RoutedBatch* batch, float* out_u, float* out_i,
               float* out_w) const {
    batch->PrepareLookup(
        std::vector<client::LookupSpec>{
            {0, users, out_u}, {1, items, out_i}, {2, wides, out_w}},
        tables, keys, map);
    (void)batch->Route(map);
  }
  const std::vector<client::TableSchema> tables = {
      {"user", 8}, {"item", 4}, {"wide", 8}};
  std::vector<uint64_t> keys;
  ShardMap map;
  const std::vector<int64_t> users = {10, 11, 12, 10, 13, 14, 15};
  const std::vector<int64_t> items = {20, 21, 22, 23};
  const std::vector<int64_t> wides = {5, 6, 5};
};

}  // namespace recps::fuzz

#endif  // RECPS_TESTS_FUZZ_LOOKUP_RESPONSE_FIXTURE_H_

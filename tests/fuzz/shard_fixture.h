// A small shard server for the request fuzzers: a host store of four tables
// (fixed, dynamic, Adam, and one split column-wise whose first group this
// server holds), under a map of two servers, in async mode so that no lookup
// waits. Plus a digest of every stored row, to check that a refused request
// changed nothing.
#ifndef RECPS_TESTS_FUZZ_SHARD_FIXTURE_H_
#define RECPS_TESTS_FUZZ_SHARD_FIXTURE_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "server/store/embedding_store.h"
#include "server/shard/shard_server.h"
#include "tests/testing/column_groups.h"

namespace recps::fuzz {

inline constexpr char kSelf[] = "127.0.0.1:1";
inline constexpr char kOther[] = "127.0.0.1:2";
inline constexpr uint32_t kSlots = 16;
inline constexpr uint64_t kEpoch = 3;
inline constexpr int kWorld = 2;
// The tables a request may name (the last two are the column groups of
// "wide"; the first of them is this server's).
inline const char* const kTableNames[] = {
    "fixed", "dynamic", "adam", "wide", "wide.cols0-4", "wide.cols4-8"};

inline std::vector<config::TableSpec> FixtureTables() {
  config::TableSpec fixed;
  fixed.name = "fixed";
  fixed.dim = 4;
  fixed.num_rows = 64;
  fixed.optimizer.kind = OptimizerKind::kSgd;
  fixed.optimizer.learning_rate = 0.5f;
  config::TableSpec dynamic = fixed;
  dynamic.name = "dynamic";
  dynamic.num_rows = 0;
  dynamic.dim = 3;
  dynamic.optimizer.kind = OptimizerKind::kAdagrad;
  config::TableSpec adam = fixed;
  adam.name = "adam";
  adam.dim = 2;
  adam.num_rows = 32;
  adam.optimizer.kind = OptimizerKind::kAdam;
  config::TableSpec wide = fixed;
  wide.name = "wide";
  wide.dim = 8;
  wide.num_rows = 0;
  wide.optimizer.kind = OptimizerKind::kRowWiseAdagrad;
  return {fixed, dynamic, adam, wide};
}

inline server::StoreOptions FixtureStoreOptions() {
  server::StoreOptions o;
  o.num_slots = kSlots;
  o.max_rows_per_table = 256;
  o.seed = 7;
  return o;
}

// Two servers, slots split evenly; "adam" wholly on this server, "wide"
// split column-wise [0,4) here, [4,8) on the other.
inline v1::ShardMap FixtureMapProto() {
  v1::ShardMap map = ShardMap::Uniform(kEpoch, kSlots, {kSelf, kOther}).ToProto();
  v1::TableRouting* adam = map.add_tables();
  adam->set_table("adam");
  adam->set_owner(0);
  testing::AddColumnGroups(&map, "wide", {0, 4, 8}, {0, 1});
  return map;
}

inline std::unique_ptr<server::ShardServer> MakeFixtureServer() {
  auto store = server::CreateHostEmbeddingStore(FixtureTables(),
                                                FixtureStoreOptions());
  if (!store.ok()) {
    std::fprintf(stderr, "fixture store: %s\n", store.status().ToString().c_str());
    std::abort();
  }
  absl::StatusOr<ShardMap> map = ShardMap::FromProto(FixtureMapProto());
  if (!map.ok()) std::abort();
  server::ShardServerOptions options;
  options.self_address = kSelf;
  options.num_slots = kSlots;
  options.max_ids_per_request = 512;
  options.consistency.mode = server::ConsistencyMode::kAsync;
  options.consistency.world_size = kWorld;
  options.work_threads = 1;
  options.create_store = [](std::vector<config::TableSpec> specs) {
    return server::CreateHostEmbeddingStore(std::move(specs),
                                            FixtureStoreOptions());
  };
  auto server = server::ShardServer::Create(*std::move(store), *std::move(map),
                                            std::move(options), nullptr);
  if (!server.ok()) {
    std::fprintf(stderr, "fixture server: %s\n", server.status().ToString().c_str());
    std::abort();
  }
  return *std::move(server);
}

// Every table's row count and counters and the bytes of every stored row
// (FNV-1a over ExportSlot's chunks, slot by slot).
inline std::string StoreDigest(const server::EmbeddingStore& store) {
  std::string out;
  for (int t = 0; t < store.num_tables(); ++t) {
    const server::TableInfo info = store.Info(t);
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](const void* p, size_t n) {
      const auto* b = static_cast<const unsigned char*>(p);
      for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      server::SlotCursor cursor;
      while (!cursor.done) {
        server::SlotChunk chunk;
        if (!store.ExportSlot(t, slot, &cursor, 1024, &chunk).ok()) std::abort();
        mix(chunk.ids.data(), chunk.ids.size() * sizeof(int64_t));
        mix(chunk.rows.data(), chunk.rows.size() * sizeof(float));
      }
    }
    out += info.name + ":" + std::to_string(info.rows) + ":" +
           std::to_string(info.update_ids) + ":" + std::to_string(h) + ";";
  }
  return out;
}

// Ids worth trying: this server's and the other's, edges of the fixed
// tables, and the extremes.
inline int64_t InterestingId(uint8_t pick, int64_t raw) {
  switch (pick % 8) {
    case 0: return pick / 8;               // small: both servers' slots
    case 1: return 63;                     // last row of "fixed"
    case 2: return 64;                     // one past it
    case 3: return -1;
    case 4: return INT64_MIN;
    case 5: return INT64_MAX;
    case 6: return 31 + pick / 8 % 3;      // edges of "adam"
    default: return raw;
  }
}

}  // namespace recps::fuzz

#endif  // RECPS_TESTS_FUZZ_SHARD_FIXTURE_H_

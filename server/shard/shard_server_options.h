// What a shard server is built with (ShardServer::Create); its parts
// (the map keeper, the slot moves, the snapshot writer) read their share.
#ifndef RECPS_SERVER_SHARD_SHARD_SERVER_OPTIONS_H_
#define RECPS_SERVER_SHARD_SHARD_SERVER_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config/table_spec.h"
#include "server/shard/shard_peer.h"
#include "server/shard/step_clock.h"
#include "server/store/embedding_store.h"

namespace recps::server {

struct ShardServerOptions {
  // This server's address as it appears in shard maps (SetShardMap may set
  // it when the server learns its port only after binding).
  std::string self_address;
  // The cluster's slot count; every shard map must use it (and the store
  // must have been built with it).
  uint32_t num_slots = 4096;
  // Most ids (summed over tables) one request may carry.
  int64_t max_ids_per_request = int64_t{1} << 22;
  ConsistencyOptions consistency;
  // Threads that run pushes and the lookups a step's apply releases.
  int work_threads = 0;  // 0: one per hardware thread
  // Builds a store for tables the server gains from a shard map: the column
  // groups it owns of a table split column-wise. Give it the options of the
  // server's own store (seed, num_slots, row limit), e.g. a
  // CreateHostEmbeddingStore call. Unset: maps that give this server a
  // column group are refused.
  std::function<absl::StatusOr<std::unique_ptr<EmbeddingStore>>(
      std::vector<config::TableSpec>)>
      create_store;
  // Called (under the install lock, never concurrently) each time a map
  // that lists this server is installed, its tables created: the server can
  // serve from then on (recps-shard flips its health status).
  std::function<void()> on_map_installed;
  // Slot moves: how this server reaches another shard server (recps-shard
  // passes ConnectGrpcShardPeer). Unset: MigrateIn and HandOver are
  // FAILED_PRECONDITION.
  ConnectPeerFn connect_peer;
  // Longest a push forwarded to a backup may take (replication).
  absl::Duration replicate_timeout = absl::Seconds(30);
  // Longest a move's stream or shard-to-shard call may take.
  absl::Duration move_rpc_timeout = absl::Minutes(10);
  // Copy rounds of a MigrateIn: the first copies every row, each later one
  // the rows changed meanwhile, until a round carries at most
  // max(move_catch_up_rows, 1% of the rows) or move_max_rounds ran.
  int move_max_rounds = 8;
  int64_t move_catch_up_rows = 4096;
  // Rows per chunk of an export: at most this many bytes (ExportRows'
  // max_chunk_bytes may ask for less or more, up to 16 MiB).
  int64_t move_chunk_bytes = int64_t{1} << 20;
  // ExportRows streams a copy round runs at once (each over every k-th
  // slot of the move).
  int move_streams = 2;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_SERVER_OPTIONS_H_

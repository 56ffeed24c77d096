#include "server/shard/shard_server.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "server/store/store_footprint.h"

namespace recps::server {
namespace {

uint64_t NewIncarnation() {
  absl::BitGen gen;
  uint64_t v = 0;
  while (v == 0) v = absl::Uniform<uint64_t>(gen);
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Create(
    std::unique_ptr<EmbeddingStore> store, ShardMap initial_map,
    ShardServerOptions options, ShardMetrics* metrics) {
  if (store == nullptr) return absl::InvalidArgumentError("store is null");
  const ConsistencyOptions& c = options.consistency;
  if (c.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size must be >= 1, got ", c.world_size));
  }
  if (c.mode == ConsistencyMode::kBounded && c.staleness < 0) {
    return absl::InvalidArgumentError("staleness must be >= 0");
  }
  if (initial_map.num_servers() > 0 &&
      initial_map.num_slots() != options.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial shard map has ", initial_map.num_slots(), " slots, expected ",
        options.num_slots));
  }
  if (options.move_streams < 1 || options.move_streams > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "move_streams is ", options.move_streams, "; allowed 1..64"));
  }
  if (options.move_chunk_bytes < 4096 ||
      options.move_chunk_bytes > (int64_t{16} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "move_chunk_bytes is ", options.move_chunk_bytes,
        "; allowed 4096..16777216"));
  }
  if (options.move_max_rounds < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "move_max_rounds is ", options.move_max_rounds,
        "; at least 2 (a copy and one catch-up round)"));
  }
  if (options.max_ids_per_request < 1) {
    return absl::InvalidArgumentError("max_ids_per_request must be >= 1");
  }
  if (c.max_parked_lookups < 1 || c.max_parked_ids < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_parked_lookups (", c.max_parked_lookups, ") and max_parked_ids (",
        c.max_parked_ids, ") must be >= 1"));
  }
  std::unique_ptr<ShardServer> server(new ShardServer(
      std::move(store), std::move(initial_map), std::move(options), metrics));
  const MapView view = server->CurrentMap();
  if (view->self >= 0) {
    RETURN_IF_ERROR(server->map_->AddColumnGroupTables(view->map, view->self));
  }
  return server;
}

ShardServer::ShardServer(std::unique_ptr<EmbeddingStore> store, ShardMap map,
                         ShardServerOptions options, ShardMetrics* metrics)
    : store_(std::make_unique<LayeredStore>(std::move(store))),
      options_(std::move(options)),
      metrics_(metrics),
      incarnation_(NewIncarnation()) {
  // Each install (under the keeper's lock) first readies the replica clocks
  // of the primaries the map makes this server a backup of.
  map_ = std::make_unique<ShardMapKeeper>(
      store_.get(), options_.num_slots, std::move(map), options_.self_address,
      options_.create_store, [this] {
        if (data_ != nullptr) data_->OnMapInstalled();
        if (options_.on_map_installed) options_.on_map_installed();
      });
  work_ = std::make_unique<WorkQueue>(options_.work_threads);
  holds_ = std::make_unique<UnitHolds>(store_.get(), options_.num_slots, work_.get());
  data_ = std::make_unique<ShardDataPlane>(store_.get(), &options_, metrics_,
                                           incarnation_, map_.get(), holds_.get(),
                                           work_.get());
  data_->OnMapInstalled();  // the initial map
  ShardSnapshots::MapFacts facts;
  facts.listed = [this] { return CurrentMap()->self >= 0; };
  facts.owns_anything = [this] {
    const MapView view = CurrentMap();
    return view->map.OwnsAnything(view->self);
  };
  facts.owned_units = [this] { return map_->OwnedUnits(); };
  facts.restore_slots = [this] { return map_->RestoreSlots(); };
  snapshots_ = std::make_unique<ShardSnapshots>(
      store_.get(), &data_->clock(), &data_->replication(), metrics_,
      options_.consistency.step_timeout, std::move(facts));
  moves_ = std::make_unique<SlotMoves>(store_.get(), &options_, map_.get(),
                                       holds_.get(), &data_->clock(), snapshots_.get(),
                                       &data_->replication());
}

std::vector<int64_t> ShardServer::OwnedFixedRows() const {
  const MapView view = CurrentMap();
  std::vector<int64_t> rows(store_->num_tables(), 0);
  if (view->self < 0) return rows;
  for (int t = 0; t < store_->num_tables(); ++t) {
    const config::TableSpec& spec = store_->spec(t);
    if (spec.num_rows <= 0) continue;
    rows[t] = ExpectedFixedRows(spec.num_rows,
                                view->map.ShareOf(view->self, StableNameKey(spec.name)));
  }
  return rows;
}

void ShardServer::StopMoves() {
  moves_->Stop();
  data_->StopReplication();
}

ShardServer::~ShardServer() {
  StopMoves();
  snapshots_->Stop();
}

void ShardServer::Schedule(absl::AnyInvocable<void() &&> fn) {
  work_->Schedule(std::move(fn));
}

void ShardServer::SetSelfAddress(std::string address) {
  map_->SetSelfAddress(std::move(address));
}

v1::ShardMap ShardServer::GetShardMap() const { return map_->CurrentProto(); }

absl::Status ShardServer::SetShardMap(const v1::SetShardMapRequest& request) {
  return map_->Install(request);
}

}  // namespace recps::server

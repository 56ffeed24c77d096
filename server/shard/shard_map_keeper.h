// The shard server's map keeper: the shard map this server routes by, its
// own index and address in it, and the rules for installing a newer one
// (epochs only grow, no slot holding rows is given away except by a
// hand-over, column groups the map gives this server are created first).
// Requests read the map lock-free of the install: Current() is a shared
// pointer swapped under a short lock.
#ifndef RECPS_SERVER_SHARD_SHARD_MAP_KEEPER_H_
#define RECPS_SERVER_SHARD_SHARD_MAP_KEEPER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/wire/shard_map.h"
#include "recps/v1/shard_admin.pb.h"
#include "server/store/layered_store.h"

namespace recps::server {

// The map, this server's index in it (-1: not listed) and its address.
struct ShardRouting {
  ShardMap map;
  int self = -1;
  std::string self_address;
};

class ShardMapKeeper {
 public:
  using View = std::shared_ptr<const ShardRouting>;
  // Builds a store for column groups the map gives this server
  // (ShardServerOptions::create_store); may be empty.
  using CreateStoreFn = std::function<absl::StatusOr<std::unique_ptr<EmbeddingStore>>(
      std::vector<config::TableSpec>)>;

  // `store` outlives this object. `on_installed` (may be empty) runs under
  // the install lock after each install that lists this server.
  ShardMapKeeper(LayeredStore* store, uint32_t num_slots, ShardMap initial,
                 std::string self_address, CreateStoreFn create_store,
                 std::function<void()> on_installed);

  View Current() const;
  v1::ShardMap CurrentProto() const { return Current()->map.ToProto(); }

  // Installs a newer map (ShardServer::SetShardMap has the contract). Units
  // in `handed_over` may move away: a hand-over sent their rows.
  absl::Status Install(const v1::SetShardMapRequest& request,
                       const absl::flat_hash_set<StoreUnit>* handed_over = nullptr);
  // The address SetShardMap looks for when its request names no `self`.
  void SetSelfAddress(std::string address);
  // Creates the tables of the column groups that `map` gives server index
  // `self` and that do not exist yet.
  absl::Status AddColumnGroupTables(const ShardMap& map, int self);

  // The owner's address of a unit in `map` (`proto` is its proto form);
  // "" for a table split column-wise.
  std::string UnitOwner(const ShardMap& map, const v1::ShardMap& proto,
                        const StoreUnit& unit) const;
  // [table][slot]: 1 when this server owns the unit now (column groups
  // whole): what its checkpoint file holds.
  std::vector<std::vector<uint8_t>> OwnedUnits() const;
  // Per store table, the slots this server owns or backs up now: what a
  // restore imports here.
  std::vector<std::vector<uint32_t>> RestoreSlots() const;

 private:
  // FAILED_PRECONDITION when installing `next` would take a slot holding
  // rows away from `self`. REQUIRES: install_mu_.
  absl::Status CheckNoRowsMove(const ShardRouting& current,
                               const v1::ShardMap& next_proto,
                               const ShardMap& next, const std::string& self,
                               const absl::flat_hash_set<StoreUnit>* handed_over) const;

  LayeredStore* const store_;
  const uint32_t num_slots_;
  const CreateStoreFn create_store_;
  const std::function<void()> on_installed_;

  // Held by Install and SetSelfAddress throughout (they may create
  // tables); map_mu_ only guards the swap, so requests do not wait for that.
  absl::Mutex install_mu_;
  mutable absl::Mutex map_mu_;
  View routing_ ABSL_GUARDED_BY(map_mu_);
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_MAP_KEEPER_H_

// The cluster's shard map: slot -> owning shard server, with an epoch, and
// per-table overrides from a sharding plan (a table-wise table's one owner,
// a table's own slot owners, or a column-wise table's column groups). Plain data, cheap to copy; the proto form
// (recps.v1.ShardMap) travels on the wire and is stored by the coordinator.
#ifndef RECPS_COMMON_WIRE_SHARD_MAP_H_
#define RECPS_COMMON_WIRE_SHARD_MAP_H_

#include <cstdint>
#include <functional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/hashing.h"
#include "recps/v1/shard_map.pb.h"

namespace recps {

// The name under which columns [column_begin, column_end) of a column-wise
// table are stored and requested: "<table>.cols<begin>-<end>" (characters
// the shard store accepts in table names). The one place that spells it.
std::string ColumnGroupTableName(absl::string_view table, int column_begin,
                                 int column_end);

// One column group of a column-wise table: a table of its own, of width
// end - begin, held whole (every id) by `owner`.
struct ColumnGroup {
  int begin = 0;
  int end = 0;
  int owner = 0;      // index into ShardMap::servers()
  std::vector<uint32_t> backups;  // replication - 1 entries, or none
  std::string table;  // ColumnGroupTableName(the table, begin, end)
  uint64_t key = 0;   // StableNameKey(table)
};

// A backup lost and not yet replaced (v1::ShardMap.slot_backups).
inline constexpr uint32_t kNoBackup = 0xFFFFFFFFu;

// How the ids of one table find their server; resolve it once per table
// and batch (ShardMap::RouteOf), then call OwnerOf per id. Valid while the
// ShardMap it came from lives.
class TableRoute {
 public:
  // Index into ShardMap::servers() of the owner of `id`; -1 for a table
  // split column-wise (no server holds its whole rows: ask its groups).
  int OwnerOf(int64_t id) const {
    return owners_ == nullptr
               ? single_owner_
               : static_cast<int>(owners_[SlotOf(key_, id, num_slots_)]);
  }
  // The owner of slot `slot` (every slot of a table-wise table or column
  // group: its owner; -1 for a table split column-wise).
  // REQUIRES: slot < the map's num_slots.
  int OwnerOfSlot(uint32_t slot) const {
    return owners_ == nullptr ? single_owner_ : static_cast<int>(owners_[slot]);
  }
  // The backups of slot `slot`'s rows (as BackupsOf).
  absl::Span<const uint32_t> BackupsOfSlot(uint32_t slot) const {
    if (backup_count_ == 0) return {};
    if (slot_backups_ == nullptr) return {single_backups_, backup_count_};
    return {slot_backups_ + slot * backup_count_, backup_count_};
  }
  // The one owner of every id (table-wise, or a column group), or -1 when
  // routed by slot or split column-wise.
  int single_owner() const { return single_owner_; }
  // The table is split column-wise: its rows live in its column groups
  // (ShardMap::ColumnGroupsOf), under their own names.
  bool column_split() const { return column_split_; }
  // The table is a column group of a column-wise table.
  bool column_group() const { return column_group_; }
  // The backups of `id`'s row (ShardMap::replication() - 1 server indices,
  // kNoBackup for one lost); empty without replication or for a table split
  // column-wise.
  absl::Span<const uint32_t> BackupsOf(int64_t id) const {
    if (backup_count_ == 0) return {};
    if (slot_backups_ == nullptr) return {single_backups_, backup_count_};
    return {slot_backups_ + SlotOf(key_, id, num_slots_) * backup_count_, backup_count_};
  }

 private:
  friend class ShardMap;
  uint64_t key_ = 0;
  const uint32_t* owners_ = nullptr;  // null: single_owner_ for every id
  // Slot by slot, backup_count_ each; null: single_backups_ for every id.
  const uint32_t* slot_backups_ = nullptr;
  const uint32_t* single_backups_ = nullptr;
  size_t backup_count_ = 0;
  uint32_t num_slots_ = 0;
  int single_owner_ = -1;
  bool column_split_ = false;
  bool column_group_ = false;
};

// The most a new shard map's epoch may pass the current one: epochs grow
// by one per map change, and a far jump (to 2^64-1) would leave no epoch
// for any later map. Servers and the coordinator refuse it.
inline constexpr uint64_t kMaxShardMapEpochStep = uint64_t{1} << 20;

class ShardMap {
 public:
  ShardMap() = default;

  // Validates: num_slots > 0, at least one server, no duplicate or empty
  // server, slot_owner has num_slots entries each naming a server; table
  // routings name distinct tables, with an owner, num_slots slot owners or
  // column groups that name servers. Column groups start at column 0, are
  // contiguous and non-empty; whether they end at the table's width is
  // checked by CheckWidth, where the width is known.
  static absl::StatusOr<ShardMap> FromProto(const v1::ShardMap& proto);

  // Slots split into contiguous, equal (within one) blocks, one per server.
  static ShardMap Uniform(uint64_t epoch, uint32_t num_slots,
                          std::vector<std::string> servers);

  v1::ShardMap ToProto() const;

  uint64_t epoch() const { return epoch_; }
  uint32_t num_slots() const { return num_slots_; }
  const std::vector<std::string>& servers() const { return servers_; }
  int num_servers() const { return static_cast<int>(servers_.size()); }

  // Index into servers() of the owner of `slot`. REQUIRES: slot < num_slots.
  int OwnerOfSlot(uint32_t slot) const { return slot_owner_[slot]; }
  // Copies of each row: 1 + the backups of each unit (1: no backups).
  int replication() const { return replication_; }
  // The backups of `slot` in the global slot owners (replication() - 1
  // entries, kNoBackup for one lost). REQUIRES: slot < num_slots.
  absl::Span<const uint32_t> BackupsOfSlot(uint32_t slot) const {
    const size_t n = static_cast<size_t>(replication_ - 1);
    return {slot_backups_.data() + slot * n, n};
  }
  // The servers that back up any unit server index `server` owns, ascending
  // (a primary forwards each push to all of them, so that each sees every
  // step of every worker, empty parts too).
  absl::Span<const uint32_t> BackupServersOf(int server) const {
    if (server < 0 || static_cast<size_t>(server) >= backup_servers_.size()) return {};
    return backup_servers_[server];
  }
  // Units (slots of the global owners or of a table's own, table-wise
  // tables, column groups) with a backup lost and not yet replaced.
  int64_t UnderReplicatedUnits() const;
  // Whether server index `server` is a backup of anything.
  bool BacksAnything(int server) const {
    return server >= 0 && static_cast<size_t>(server) < backs_.size() &&
           backs_[server] != 0;
  }
  // Sets replication() and the backups of every unit: `backups(owner)` gives
  // the replication - 1 backups of what server index `owner` owns
  // (placement: common/wire/replica_placement.h). INVALID_ARGUMENT as
  // FromProto's checks.
  absl::Status SetBackups(int replication,
                          const std::function<std::vector<uint32_t>(int owner)>& backups);
  // How table `table_key` (StableNameKey of its name) is routed: by the
  // global slot owners unless the map has a routing of its own for it.
  TableRoute RouteOf(uint64_t table_key) const;
  // Index of the server that owns (table, id). In loops over many ids,
  // resolve RouteOf(table_key) once instead.
  int OwnerOf(uint64_t table_key, int64_t id) const {
    if (tables_.empty()) return slot_owner_[SlotOf(table_key, id, num_slots_)];
    return RouteOf(table_key).OwnerOf(id);
  }
  // Whether any table has a routing of its own.
  bool has_table_routing() const { return !tables_.empty(); }
  // The column groups of table `table_key`, in column order; empty unless
  // the table is split column-wise. Valid while this map lives.
  absl::Span<const ColumnGroup> ColumnGroupsOf(uint64_t table_key) const;
  // INVALID_ARGUMENT naming the table when it is split column-wise and its
  // groups do not cover exactly `dim` columns; OK otherwise.
  absl::Status CheckWidth(absl::string_view table, int dim) const;
  // Index of `server` in servers(), or -1.
  int IndexOf(absl::string_view server) const;
  // The share of table `table_key`'s ids that server index `server` owns,
  // with ids spread evenly over slots: 1 or 0 for a table-wise table or a
  // column group, its slots / num_slots for one routed by slot, 0 for a
  // table split column-wise (its groups are tables of their own).
  double ShareOf(int server, uint64_t table_key) const;
  // The slots owned by server index `server` in the global slot owners,
  // ascending.
  std::vector<uint32_t> SlotsOf(int server) const;
  // Whether server index `server` owns anything: a global slot, a slot of
  // a table routed by its own owners, a table-wise table or a column group.
  // A server that owns nothing (joined, not yet given a share; drained) is
  // sent no requests, pushes included (docs/shard-server.md).
  bool OwnsAnything(int server) const {
    return server >= 0 && static_cast<size_t>(server) < owns_.size() &&
           owns_[server] != 0;
  }

 private:
  void ComputeOwners();
  // Checks the backups of every unit against its owner and the servers.
  absl::Status CheckBackups() const;

  uint64_t epoch_ = 0;
  uint32_t num_slots_ = 0;
  std::vector<std::string> servers_;
  std::vector<uint32_t> slot_owner_;
  int replication_ = 1;
  std::vector<uint32_t> slot_backups_;  // num_slots x (replication_ - 1)
  std::vector<uint8_t> owns_;   // per server: OwnsAnything
  std::vector<uint8_t> backs_;  // per server: BacksAnything
  std::vector<std::vector<uint32_t>> backup_servers_;  // per server: BackupServersOf
  struct TableRouting {
    uint64_t key = 0;
    std::string name;
    int owner = -1;                    // >= 0: table-wise or a column group
    std::vector<uint32_t> slot_owner;  // else num_slots entries, or
    std::vector<ColumnGroup> groups;   // the column groups of a split table
    // replication_ - 1 backups of a table-wise table or a column group, or
    // num_slots x (replication_ - 1) with slot_owner.
    std::vector<uint32_t> backups;
    // A column group's own entry (routes its name to its owner); derived
    // from its table's entry, not written by ToProto.
    bool is_group = false;
  };
  const TableRouting* Find(uint64_t table_key) const;
  // Sorted by key; few entries (one per table placed other than globally,
  // plus one per column group).
  std::vector<TableRouting> tables_;
};

}  // namespace recps

#endif  // RECPS_COMMON_WIRE_SHARD_MAP_H_

#include "server/shard/shard_map_keeper.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace recps::server {
namespace {

// A column group of `table` as a table of its own: the group's columns, the
// same rows, optimizer and initial values.
config::TableSpec ColumnGroupSpec(const config::TableSpec& table, const ColumnGroup& group) {
  config::TableSpec spec = table;
  spec.name = group.table;
  spec.dim = group.end - group.begin;
  if (spec.init.source_key == 0) spec.init.source_key = StableNameKey(table.name);
  spec.init.column_offset += group.begin;
  return spec;
}

// The address of the server that holds `slot` of table `name` in `map`
// (`proto` is its proto form: per-table slot owners are not exposed by
// TableRoute); empty when the table is split column-wise.
std::string SlotOwnerOf(const ShardMap& map, const v1::ShardMap& proto,
                        const std::string& name, uint64_t key, uint32_t slot) {
  const TableRoute route = map.RouteOf(key);
  if (route.column_split()) return "";
  if (route.single_owner() >= 0) return map.servers()[route.single_owner()];
  for (const v1::TableRouting& t : proto.tables()) {
    if (t.table() == name && static_cast<uint32_t>(t.slot_owner_size()) > slot) {
      return map.servers()[t.slot_owner(static_cast<int>(slot))];
    }
  }
  return map.servers()[map.OwnerOfSlot(slot)];
}

}  // namespace

ShardMapKeeper::ShardMapKeeper(LayeredStore* store, uint32_t num_slots,
                               ShardMap initial, std::string self_address,
                               CreateStoreFn create_store,
                               std::function<void()> on_installed)
    : store_(store),
      num_slots_(num_slots),
      create_store_(std::move(create_store)),
      on_installed_(std::move(on_installed)) {
  const int self = initial.IndexOf(self_address);
  routing_ = std::make_shared<const ShardRouting>(
      ShardRouting{std::move(initial), self, std::move(self_address)});
}

ShardMapKeeper::View ShardMapKeeper::Current() const {
  absl::MutexLock lock(&map_mu_);
  return routing_;
}

absl::Status ShardMapKeeper::AddColumnGroupTables(const ShardMap& map, int self) {
  std::vector<config::TableSpec> specs;
  for (int t = 0; t < store_->num_base_tables(); ++t) {
    const config::TableSpec& table = store_->spec(t);
    const absl::Span<const ColumnGroup> groups =
        map.ColumnGroupsOf(StableNameKey(table.name));
    if (groups.empty()) continue;
    RETURN_IF_ERROR(map.CheckWidth(table.name, table.dim));
    for (const ColumnGroup& g : groups) {
      if (g.owner != self) continue;
      const absl::StatusOr<int> existing = store_->FindTable(g.table);
      if (existing.ok() && *existing < store_->num_base_tables()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard map epoch ", map.epoch(), ": column group ", g.table,
            " of table ", table.name,
            " has the name of a configured table; rename that table"));
      }
      if (!existing.ok()) specs.push_back(ColumnGroupSpec(table, g));
    }
  }
  if (specs.empty()) return absl::OkStatus();
  if (!create_store_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), " gives this server column group ",
        specs[0].name, ", but it was built without a store factory "
        "(ShardServerOptions.create_store)"));
  }
  absl::StatusOr<std::unique_ptr<EmbeddingStore>> added =
      create_store_(specs);
  if (!added.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), ": creating column group table ",
        specs[0].name, (specs.size() > 1 ? " and others" : ""), ": ",
        added.status().message()));
  }
  RETURN_IF_ERROR(store_->Add(*std::move(added)));
  for (const config::TableSpec& spec : specs) {
    LogInfo("created column group table ", spec.name, " (dim ", spec.dim,
            ", columns from ", spec.init.column_offset, ")");
  }
  return absl::OkStatus();
}

absl::Status ShardMapKeeper::CheckNoRowsMove(
    const ShardRouting& current, const v1::ShardMap& next_proto,
    const ShardMap& next, const std::string& self,
    const absl::flat_hash_set<StoreUnit>* handed_over) const {
  if (current.self < 0 || current.map.num_servers() == 0) return absl::OkStatus();
  const std::vector<int64_t> per_slot = store_->RowsPerSlot();
  const v1::ShardMap current_proto = current.map.ToProto();
  const uint32_t num_slots =
      std::min<uint32_t>(next.num_slots(), static_cast<uint32_t>(per_slot.size()));
  // slot -> the new owner (first table found moving it), in slot order.
  std::map<uint32_t, std::string> moved;
  for (int t = 0; t < store_->num_tables(); ++t) {
    const config::TableSpec& spec = store_->spec(t);
    if (store_->Info(t).rows == 0) continue;
    const uint64_t key = StableNameKey(spec.name);
    for (uint32_t slot = 0; slot < num_slots; ++slot) {
      if (per_slot[slot] == 0 || moved.count(slot) > 0) continue;
      if (handed_over != nullptr && handed_over->contains({t, slot})) continue;
      if (SlotOwnerOf(current.map, current_proto, spec.name, key, slot) !=
          current.self_address) {
        continue;  // rows of other tables (RowsPerSlot sums every table)
      }
      std::string owner = SlotOwnerOf(next, next_proto, spec.name, key, slot);
      if (owner != self) {
        moved.emplace(slot, owner.empty()
                                ? absl::StrCat("the column groups of ", spec.name)
                                : std::move(owner));
      }
    }
  }
  if (moved.empty()) return absl::OkStatus();
  constexpr int kNamed = 5;
  std::string listed;
  int named = 0;
  for (const auto& [slot, owner] : moved) {
    if (named == kNamed) break;
    absl::StrAppend(&listed, named++ > 0 ? ", " : "", "slot ", slot, " (",
                    per_slot[slot], " rows) -> ", owner);
  }
  if (moved.size() > kNamed) {
    absl::StrAppend(&listed, " and ", moved.size() - kNamed, " more");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "shard map epoch ", next.epoch(), " would move ", moved.size(),
      " slot(s) holding rows away from this server (", self, "): ", listed,
      ". Their rows would be lost: the new owner would start them from "
      "their initial values. Refused; this server keeps epoch ",
      current.map.epoch(), ". Move slots with rows by a slot move "
      "(MigrateIn on the new owner, then HandOver here: recpsctl rebalance), "
      "or restore them from a checkpoint on their new owners"));
}

std::string ShardMapKeeper::UnitOwner(const ShardMap& map,
                                   const v1::ShardMap& proto,
                                   const StoreUnit& unit) const {
  const std::string& name = store_->spec(unit.first).name;
  return SlotOwnerOf(map, proto, name, StableNameKey(name), unit.second);
}

std::vector<std::vector<uint8_t>> ShardMapKeeper::OwnedUnits() const {
  const View view = Current();
  const v1::ShardMap proto = view->map.ToProto();
  std::vector<std::vector<uint8_t>> owned(store_->num_tables());
  for (int t = 0; t < store_->num_tables(); ++t) {
    owned[t].resize(num_slots_);
    for (uint32_t slot = 0; slot < num_slots_; ++slot) {
      const std::string owner = UnitOwner(view->map, proto, {t, slot});
      // Column groups are routed by group, not by slot: kept whole.
      owned[t][slot] = owner.empty() || owner == view->self_address ||
                       t >= store_->num_base_tables();
    }
  }
  return owned;
}

std::vector<std::vector<uint32_t>> ShardMapKeeper::RestoreSlots() const {
  const View view = Current();
  const v1::ShardMap proto = view->map.ToProto();
  const uint32_t self = static_cast<uint32_t>(view->self);
  const int per = view->map.replication() - 1;
  // Whether this server holds slot s of owners / backups (per entries a
  // slot): as its owner, or as one of its backups (replication).
  const auto holds = [&](const google::protobuf::RepeatedField<uint32_t>& owners,
                         const google::protobuf::RepeatedField<uint32_t>& backups,
                         uint32_t s) {
    if (owners.Get(static_cast<int>(s)) == self) return true;
    for (int k = 0; k < per && static_cast<int>(s) * per + k < backups.size(); ++k) {
      if (backups.Get(static_cast<int>(s) * per + k) == self) return true;
    }
    return false;
  };
  std::vector<uint32_t> global;
  for (uint32_t s = 0; s < num_slots_; ++s) {
    if (holds(proto.slot_owner(), proto.slot_backups(), s)) global.push_back(s);
  }
  std::vector<uint32_t> every(num_slots_);
  for (uint32_t s = 0; s < num_slots_; ++s) every[s] = s;
  std::vector<std::vector<uint32_t>> slots_by_table(store_->num_tables());
  for (int t = 0; t < store_->num_tables(); ++t) {
    const std::string& name = store_->spec(t).name;
    const TableRoute route = view->map.RouteOf(StableNameKey(name));
    if (route.column_split()) continue;  // its groups are tables of their own
    if (route.single_owner() >= 0) {
      const absl::Span<const uint32_t> backups = route.BackupsOf(0);
      if (route.single_owner() == view->self ||
          std::find(backups.begin(), backups.end(), self) != backups.end()) {
        slots_by_table[t] = every;
      }
      continue;
    }
    bool own = false;
    for (const v1::TableRouting& r : proto.tables()) {
      if (r.table() != name ||
          r.slot_owner_size() != static_cast<int>(num_slots_)) {
        continue;
      }
      own = true;
      for (uint32_t s = 0; s < num_slots_; ++s) {
        if (holds(r.slot_owner(), r.slot_backups(), s)) slots_by_table[t].push_back(s);
      }
    }
    if (!own) slots_by_table[t] = global;
  }
  return slots_by_table;
}

void ShardMapKeeper::SetSelfAddress(std::string address) {
  absl::MutexLock install(&install_mu_);
  const View view = Current();
  const int self = view->map.IndexOf(address);
  if (self >= 0) {
    if (absl::Status s = AddColumnGroupTables(view->map, self); !s.ok()) {
      LogError(s.message());
    }
  }
  {
    absl::MutexLock lock(&map_mu_);
    routing_ = std::make_shared<const ShardRouting>(
        ShardRouting{routing_->map, self, std::move(address)});
  }
  if (self >= 0 && on_installed_) on_installed_();
}

absl::Status ShardMapKeeper::Install(
    const v1::SetShardMapRequest& request,
    const absl::flat_hash_set<StoreUnit>* handed_over) {
  ASSIGN_OR_RETURN(ShardMap map, ShardMap::FromProto(request.shard_map()));
  if (map.num_slots() != num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map has ", map.num_slots(), " slots; this cluster has ",
        num_slots_));
  }
  absl::MutexLock install(&install_mu_);
  const View current = Current();  // changes only under install_mu_
  const std::string self =
      request.self().empty() ? current->self_address : request.self();
  const int index = map.IndexOf(self);
  if (index < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), " does not list this server (",
        self.empty() ? "address unknown: set SetShardMapRequest.self" : self,
        ")"));
  }
  // Epochs grow by one per map change: a far jump (2^64-1 from a broken or
  // hostile coordinator) would leave no epoch for any later map.
  const uint64_t base = current->map.num_servers() > 0 ? current->map.epoch() : 0;
  if (map.epoch() > base + kMaxShardMapEpochStep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), " jumps more than ", kMaxShardMapEpochStep,
        " past the current ", base, "; epochs grow by one per map change"));
  }
  if (current->map.num_servers() > 0 && map.epoch() <= current->map.epoch()) {
    // Already delivered (a retry, or a late copy): not a refusal. The same
    // map again is OK; anything else at an epoch not newer ALREADY_EXISTS.
    if (map.epoch() == current->map.epoch() && index == current->self &&
        map.ToProto().SerializeAsString() ==
            current->map.ToProto().SerializeAsString()) {
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(absl::StrCat(
        "shard map epoch ", map.epoch(), " is not newer than the current ",
        current->map.epoch(), "; this server keeps epoch ",
        current->map.epoch()));
  }
  RETURN_IF_ERROR(
      CheckNoRowsMove(*current, request.shard_map(), map, self, handed_over));
  // Before the map: a request routed by it finds its tables.
  RETURN_IF_ERROR(AddColumnGroupTables(map, index));
  {
    absl::MutexLock lock(&map_mu_);
    routing_ = std::make_shared<const ShardRouting>(ShardRouting{std::move(map), index, self});
  }
  if (on_installed_) on_installed_();
  return absl::OkStatus();
}

}  // namespace recps::server

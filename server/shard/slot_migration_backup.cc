// SlotMoves, re-replication's checks (docs/replication.md): which units a
// map that adds a backup gives the new backup, that a new backup holds no
// copy of them yet, and that the owner steps them on its own clock. The
// copy and the hand-over themselves are the move's (slot_migration.cc,
// slot_migration_source.cc), with the source keeping the units.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "server/shard/slot_moves.h"

namespace recps::server {
namespace {

// The addresses of `backups` (kNoBackup left out), sorted.
std::vector<std::string> BackupAddresses(const ShardMap& map,
                                         absl::Span<const uint32_t> backups) {
  std::vector<std::string> out;
  for (uint32_t b : backups) {
    if (b != kNoBackup && static_cast<int>(b) < map.num_servers()) {
      out.push_back(map.servers()[b]);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::StatusOr<std::vector<SlotMoves::Unit>> SlotMoves::BackupDiff(
    const ShardMap& current, const ShardMap& next, const std::string& owner,
    const std::string& backup) const {
  // One unit's owner and backups in both maps: unchanged, or `backup`
  // added to a unit of `owner`. Returns whether it was added.
  const auto compare = [&](const std::string& what, int owner_before, int owner_after,
                           absl::Span<const uint32_t> before,
                           absl::Span<const uint32_t> after) -> absl::StatusOr<bool> {
    const std::string was = owner_before >= 0 ? current.servers()[owner_before] : "";
    const std::string is = owner_after >= 0 ? next.servers()[owner_after] : "";
    std::vector<std::string> had = BackupAddresses(current, before);
    const std::vector<std::string> has = BackupAddresses(next, after);
    if (was == is && had == has) return false;
    if (was == is && was == owner &&
        std::find(had.begin(), had.end(), backup) == had.end()) {
      had.push_back(backup);
      std::sort(had.begin(), had.end());
      if (had == has) return true;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "new_map (epoch ", next.epoch(), ") changes more of ", what, " than adding ", backup,
        " to the backups of ", owner, "'s units (current epoch ", current.epoch(), ")"));
  };
  std::vector<Unit> units;
  for (int t = 0; t < store_->num_base_tables(); ++t) {
    const uint64_t key = StableNameKey(store_->spec(t).name);
    const TableRoute from = current.RouteOf(key);
    const TableRoute to = next.RouteOf(key);
    if (from.column_split() || to.column_split()) continue;  // groups: not re-replicated
    for (uint32_t slot = 0; slot < options_.num_slots; ++slot) {
      ASSIGN_OR_RETURN(const bool added,
                       compare(absl::StrCat("slot ", slot, " of table ", store_->spec(t).name),
                               from.OwnerOfSlot(slot), to.OwnerOfSlot(slot),
                               from.BackupsOfSlot(slot), to.BackupsOfSlot(slot)));
      if (added) units.emplace_back(t, slot);
    }
  }
  // The map's own slot owners route no row when every table is whole; a
  // copy still lists their slots (as a move does).
  bool slot_backups_added = false;
  for (uint32_t slot = 0; slot < options_.num_slots; ++slot) {
    ASSIGN_OR_RETURN(const bool added,
                     compare(absl::StrCat("slot ", slot), current.OwnerOfSlot(slot),
                             next.OwnerOfSlot(slot), current.BackupsOfSlot(slot),
                             next.BackupsOfSlot(slot)));
    slot_backups_added |= added;
  }
  if (units.empty() && !slot_backups_added) {
    return absl::InvalidArgumentError(absl::StrCat(
        "new_map (epoch ", next.epoch(), ") adds ", backup, " as a backup of nothing ", owner,
        " owns"));
  }
  std::sort(units.begin(), units.end());
  return units;
}

absl::Status SlotMoves::CheckNotACopy(const ShardMap& map, absl::Span<const Unit> units,
                                      const std::string& self) const {
  const int me = map.IndexOf(self);
  for (const auto& [table, slot] : units) {
    const TableRoute route = map.RouteOf(StableNameKey(store_->spec(table).name));
    const absl::Span<const uint32_t> backups = route.BackupsOfSlot(slot);
    if (route.OwnerOfSlot(slot) == me ||
        std::find(backups.begin(), backups.end(), static_cast<uint32_t>(me)) != backups.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slot ", slot, " of table ", store_->spec(table).name, " has a copy on this server (",
          self, ") at shard map epoch ", map.epoch(), " already: a new backup must be "
          "another server"));
    }
  }
  if (map.replication() <= 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard map epoch ", map.epoch(), " keeps no backups (replication 1)"));
  }
  return absl::OkStatus();
}

absl::Status SlotMoves::AllowExport(const v1::AllowExportRequest& request) {
  if (request.for_backup()) {
    const MapView view = CurrentMap();
    if (view->self < 0) {
      return absl::FailedPreconditionError("this server has no shard map that lists it");
    }
    const std::vector<uint32_t> slots(request.slots().begin(), request.slots().end());
    const std::vector<std::string> tables(request.tables().begin(), request.tables().end());
    ASSIGN_OR_RETURN(const std::vector<Unit> units,
                     ResolveUnits(view, slots, tables, view->self_address));
    RETURN_IF_ERROR(replication_->CheckOwnClock(units));
  }
  return export_grants_.Allow(request);
}

}  // namespace recps::server

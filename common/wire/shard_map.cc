#include "common/wire/shard_map.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace recps {
namespace {

// Far above any table width (the store's limit is 4096); keeps column
// numbers well inside int.
constexpr uint32_t kMaxColumns = uint32_t{1} << 16;
// Copies of a row: far above any useful count, and below what would let
// a map's backups outgrow its slots by much.
constexpr uint32_t kMaxReplication = 8;

}  // namespace

std::string ColumnGroupTableName(absl::string_view table, int column_begin,
                                 int column_end) {
  return absl::StrCat(table, ".cols", column_begin, "-", column_end);
}

absl::StatusOr<ShardMap> ShardMap::FromProto(const v1::ShardMap& proto) {
  if (proto.num_slots() == 0) {
    return absl::InvalidArgumentError("shard map: num_slots must be > 0");
  }
  if (proto.servers_size() == 0) {
    return absl::InvalidArgumentError("shard map: no servers");
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::string& s : proto.servers()) {
    if (s.empty()) return absl::InvalidArgumentError("shard map: empty server address");
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(absl::StrCat("shard map: server ", s, " listed twice"));
    }
  }
  if (proto.slot_owner_size() != static_cast<int>(proto.num_slots())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map: ", proto.slot_owner_size(), " slot owners for ",
        proto.num_slots(), " slots"));
  }
  ShardMap m;
  m.epoch_ = proto.epoch();
  m.num_slots_ = proto.num_slots();
  m.servers_.assign(proto.servers().begin(), proto.servers().end());
  m.slot_owner_.reserve(m.num_slots_);
  for (uint32_t slot = 0; slot < m.num_slots_; ++slot) {
    const uint32_t owner = proto.slot_owner(slot);
    if (owner >= m.servers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map: slot ", slot, " owned by server index ", owner, " of ",
          m.servers_.size()));
    }
    m.slot_owner_.push_back(owner);
  }
  if (proto.replication() > kMaxReplication) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map: replication ", proto.replication(), " is above ", kMaxReplication));
  }
  m.replication_ = std::max<int>(1, static_cast<int>(proto.replication()));
  const size_t per_unit = static_cast<size_t>(m.replication_ - 1);
  auto take_backups = [&](absl::string_view what,
                          const google::protobuf::RepeatedField<uint32_t>& from,
                          size_t units, std::vector<uint32_t>* to) -> absl::Status {
    if (static_cast<size_t>(from.size()) != units * per_unit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map: ", what, " has ", from.size(), " backups where replication ",
          m.replication_, " needs ", units * per_unit));
    }
    to->assign(from.begin(), from.end());
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(take_backups("the slot owners", proto.slot_backups(), m.num_slots_,
                               &m.slot_backups_));
  absl::flat_hash_set<std::string> tables;
  for (const v1::TableRouting& t : proto.tables()) {
    if (t.table().empty()) {
      return absl::InvalidArgumentError("shard map: a table routing has no table name");
    }
    if (!tables.insert(t.table()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard map: table ", t.table(), " is routed twice"));
    }
    TableRouting r;
    r.key = StableNameKey(t.table());
    r.name = t.table();
    if (t.column_groups_size() > 0) {
      if (t.slot_owner_size() > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard map: table ", t.table(),
            " has both column groups and slot owners"));
      }
      uint32_t next = 0;  // the column the next group must start at
      for (const v1::ColumnGroupRouting& g : t.column_groups()) {
        if (g.column_begin() != next || g.column_end() <= g.column_begin() ||
            g.column_end() > kMaxColumns) {
          return absl::InvalidArgumentError(absl::StrCat(
              "shard map: table ", t.table(), " has column group [",
              g.column_begin(), ", ", g.column_end(), ") where [", next,
              ", ...) was due: groups must be non-empty, contiguous, start "
              "at column 0 and end by column ", kMaxColumns));
        }
        if (g.owner() >= m.servers_.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "shard map: column group [", g.column_begin(), ", ",
              g.column_end(), ") of table ", t.table(),
              " is owned by server index ", g.owner(), " of ",
              m.servers_.size()));
        }
        next = g.column_end();
        ColumnGroup group;
        group.begin = static_cast<int>(g.column_begin());
        group.end = static_cast<int>(g.column_end());
        group.owner = static_cast<int>(g.owner());
        group.table = ColumnGroupTableName(t.table(), group.begin, group.end);
        group.key = StableNameKey(group.table);
        RETURN_IF_ERROR(take_backups(absl::StrCat("a column group of table ", t.table()),
                                     g.backups(), 1, &group.backups));
        r.groups.push_back(std::move(group));
      }
      // Each group routes its own name to its owner.
      for (const ColumnGroup& g : r.groups) {
        TableRouting gr;
        gr.key = g.key;
        gr.name = g.table;
        gr.owner = g.owner;
        gr.backups = g.backups;
        gr.is_group = true;
        m.tables_.push_back(std::move(gr));
      }
    } else if (t.slot_owner_size() == 0) {
      if (t.owner() >= m.servers_.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard map: table ", t.table(), " owned by server index ", t.owner(),
            " of ", m.servers_.size()));
      }
      r.owner = static_cast<int>(t.owner());
      RETURN_IF_ERROR(take_backups(absl::StrCat("table ", t.table()), t.backups(), 1,
                                   &r.backups));
    } else {
      if (t.slot_owner_size() != static_cast<int>(m.num_slots_)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard map: table ", t.table(), " has ", t.slot_owner_size(),
            " slot owners for ", m.num_slots_, " slots"));
      }
      for (uint32_t owner : t.slot_owner()) {
        if (owner >= m.servers_.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "shard map: a slot of table ", t.table(), " is owned by server index ",
              owner, " of ", m.servers_.size()));
        }
      }
      r.slot_owner.assign(t.slot_owner().begin(), t.slot_owner().end());
      RETURN_IF_ERROR(take_backups(absl::StrCat("table ", t.table()), t.slot_backups(),
                                   m.num_slots_, &r.backups));
    }
    m.tables_.push_back(std::move(r));
  }
  std::sort(m.tables_.begin(), m.tables_.end(),
            [](const TableRouting& a, const TableRouting& b) { return a.key < b.key; });
  for (size_t i = 1; i < m.tables_.size(); ++i) {
    if (m.tables_[i].key == m.tables_[i - 1].key) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map: tables ", m.tables_[i - 1].name, " and ", m.tables_[i].name,
          " have the same name key"));
    }
  }
  RETURN_IF_ERROR(m.CheckBackups());
  m.ComputeOwners();
  return m;
}

void ShardMap::ComputeOwners() {
  owns_.assign(servers_.size(), 0);
  backs_.assign(servers_.size(), 0);
  backup_servers_.assign(servers_.size(), {});
  const size_t per = static_cast<size_t>(replication_ - 1);
  // The backups of units owned by owners[i], per * i onwards.
  const auto back = [&](absl::Span<const uint32_t> owners, absl::Span<const uint32_t> backups) {
    for (size_t i = 0; i < owners.size() && per > 0; ++i) {
      for (size_t k = i * per; k < (i + 1) * per && k < backups.size(); ++k) {
        const uint32_t b = backups[k];
        if (b == kNoBackup) continue;
        backs_[b] = 1;
        std::vector<uint32_t>& of = backup_servers_[owners[i]];
        if (std::find(of.begin(), of.end(), b) == of.end()) of.push_back(b);
      }
    }
  };
  for (uint32_t owner : slot_owner_) owns_[owner] = 1;
  back(slot_owner_, slot_backups_);
  for (const TableRouting& r : tables_) {
    // A split table's groups have entries of their own (is_group).
    if (r.owner >= 0) {
      owns_[r.owner] = 1;
      const uint32_t owner = static_cast<uint32_t>(r.owner);
      back(absl::MakeConstSpan(&owner, 1), r.backups);
    }
    for (uint32_t owner : r.slot_owner) owns_[owner] = 1;
    back(r.slot_owner, r.backups);
    for (const ColumnGroup& g : r.groups) owns_[g.owner] = 1;
  }
  for (std::vector<uint32_t>& of : backup_servers_) std::sort(of.begin(), of.end());
}

int64_t ShardMap::UnderReplicatedUnits() const {
  const size_t per = static_cast<size_t>(replication_ - 1);
  if (per == 0) return 0;
  const auto count = [per](absl::Span<const uint32_t> backups) {
    int64_t units = 0;
    for (size_t i = 0; i + per <= backups.size(); i += per) {
      units += std::find(backups.begin() + i, backups.begin() + i + per, kNoBackup) !=
               backups.begin() + i + per;
    }
    return units;
  };
  int64_t units = count(slot_backups_);
  // A split table's groups have entries of their own (is_group).
  for (const TableRouting& r : tables_) units += count(r.backups);
  return units;
}

absl::Status ShardMap::CheckBackups() const {
  const size_t per_unit = static_cast<size_t>(replication_ - 1);
  if (per_unit == 0) return absl::OkStatus();
  // One unit: its owner and its backups, each a server, none twice.
  const auto check = [&](absl::string_view what, uint32_t owner,
                         const uint32_t* backups) -> absl::Status {
    for (size_t i = 0; i < per_unit; ++i) {
      const uint32_t b = backups[i];
      if (b == kNoBackup) continue;
      if (b >= servers_.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard map: a backup of ", what, " is server index ", b, " of ",
            servers_.size()));
      }
      if (b == owner) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard map: server ", servers_[b], " is both the owner and a backup of ",
            what));
      }
      for (size_t j = 0; j < i; ++j) {
        if (backups[j] == b) {
          return absl::InvalidArgumentError(absl::StrCat(
              "shard map: server ", servers_[b], " is a backup of ", what, " twice"));
        }
      }
    }
    return absl::OkStatus();
  };
  for (uint32_t slot = 0; slot < num_slots_; ++slot) {
    RETURN_IF_ERROR(check(absl::StrCat("slot ", slot), slot_owner_[slot],
                          slot_backups_.data() + slot * per_unit));
  }
  for (const TableRouting& r : tables_) {
    if (r.owner >= 0) {
      RETURN_IF_ERROR(check(absl::StrCat("table ", r.name), static_cast<uint32_t>(r.owner),
                            r.backups.data()));
    }
    for (uint32_t slot = 0; slot < r.slot_owner.size(); ++slot) {
      RETURN_IF_ERROR(check(absl::StrCat("slot ", slot, " of table ", r.name),
                            r.slot_owner[slot], r.backups.data() + slot * per_unit));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardMap::SetBackups(
    int replication, const std::function<std::vector<uint32_t>(int owner)>& backups) {
  if (replication < 1 || replication > static_cast<int>(kMaxReplication)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replication ", replication, " is outside [1, ", kMaxReplication, "]"));
  }
  const size_t per_unit = static_cast<size_t>(replication - 1);
  std::vector<std::vector<uint32_t>> of_owner(servers_.size());
  for (size_t owner = 0; owner < servers_.size(); ++owner) {
    if (per_unit == 0) break;
    of_owner[owner] = backups(static_cast<int>(owner));
    if (of_owner[owner].size() != per_unit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placing replicas: ", of_owner[owner].size(), " backups for server ",
          servers_[owner], " where replication ", replication, " needs ", per_unit));
    }
  }
  const auto fill = [&](absl::Span<const uint32_t> owners, std::vector<uint32_t>* to) {
    to->clear();
    for (uint32_t owner : owners) {
      to->insert(to->end(), of_owner[owner].begin(), of_owner[owner].end());
    }
  };
  ShardMap m = *this;
  m.replication_ = replication;
  fill(m.slot_owner_, &m.slot_backups_);
  for (TableRouting& r : m.tables_) {
    if (r.owner >= 0) {
      const uint32_t owner = static_cast<uint32_t>(r.owner);
      fill(absl::MakeConstSpan(&owner, 1), &r.backups);
    } else {
      fill(r.slot_owner, &r.backups);
    }
    for (ColumnGroup& g : r.groups) {
      const uint32_t owner = static_cast<uint32_t>(g.owner);
      fill(absl::MakeConstSpan(&owner, 1), &g.backups);
    }
  }
  RETURN_IF_ERROR(m.CheckBackups());
  m.ComputeOwners();
  *this = std::move(m);
  return absl::OkStatus();
}

const ShardMap::TableRouting* ShardMap::Find(uint64_t table_key) const {
  auto it = std::lower_bound(
      tables_.begin(), tables_.end(), table_key,
      [](const TableRouting& r, uint64_t key) { return r.key < key; });
  return it != tables_.end() && it->key == table_key ? &*it : nullptr;
}

TableRoute ShardMap::RouteOf(uint64_t table_key) const {
  TableRoute route;
  route.key_ = table_key;
  route.num_slots_ = num_slots_;
  route.owners_ = slot_owner_.data();
  route.slot_backups_ = slot_backups_.data();
  route.backup_count_ = static_cast<size_t>(replication_ - 1);
  if (tables_.empty()) return route;
  if (const TableRouting* r = Find(table_key); r != nullptr) {
    if (r->owner >= 0) {
      route.owners_ = nullptr;
      route.single_owner_ = r->owner;
      route.column_group_ = r->is_group;
      route.single_backups_ = r->backups.data();
      route.slot_backups_ = nullptr;
    } else if (!r->groups.empty()) {
      route.owners_ = nullptr;  // OwnerOf: -1
      route.column_split_ = true;
      route.backup_count_ = 0;
    } else {
      route.owners_ = r->slot_owner.data();
      route.slot_backups_ = r->backups.data();
    }
  }
  return route;
}

double ShardMap::ShareOf(int server, uint64_t table_key) const {
  const TableRoute route = RouteOf(table_key);
  if (route.column_split()) return 0;
  if (route.owners_ == nullptr) return route.single_owner() == server ? 1 : 0;
  int64_t owned = 0;
  for (uint32_t slot = 0; slot < num_slots_; ++slot) {
    owned += static_cast<int>(route.owners_[slot]) == server;
  }
  return num_slots_ == 0 ? 0 : static_cast<double>(owned) / num_slots_;
}

absl::Span<const ColumnGroup> ShardMap::ColumnGroupsOf(
    uint64_t table_key) const {
  if (tables_.empty()) return {};
  const TableRouting* r = Find(table_key);
  return r == nullptr ? absl::Span<const ColumnGroup>() : r->groups;
}

absl::Status ShardMap::CheckWidth(absl::string_view table, int dim) const {
  const absl::Span<const ColumnGroup> groups =
      ColumnGroupsOf(StableNameKey(table));
  if (groups.empty() || groups.back().end == dim) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "shard map epoch ", epoch_, ": the column groups of table ", table,
      " cover columns [0, ", groups.back().end, ") but the table has dim ",
      dim));
}

ShardMap ShardMap::Uniform(uint64_t epoch, uint32_t num_slots,
                           std::vector<std::string> servers) {
  ShardMap m;
  m.epoch_ = epoch;
  m.num_slots_ = num_slots;
  m.servers_ = std::move(servers);
  const uint64_t n = m.servers_.size();
  m.slot_owner_.resize(num_slots);
  for (uint32_t slot = 0; slot < num_slots; ++slot) {
    m.slot_owner_[slot] = static_cast<uint32_t>(slot * n / num_slots);
  }
  m.ComputeOwners();
  return m;
}

v1::ShardMap ShardMap::ToProto() const {
  v1::ShardMap p;
  p.set_epoch(epoch_);
  p.set_num_slots(num_slots_);
  for (const std::string& s : servers_) p.add_servers(s);
  p.mutable_slot_owner()->Add(slot_owner_.begin(), slot_owner_.end());
  if (replication_ > 1) {
    p.set_replication(static_cast<uint32_t>(replication_));
    p.mutable_slot_backups()->Add(slot_backups_.begin(), slot_backups_.end());
  }
  for (const TableRouting& r : tables_) {
    if (r.is_group) continue;  // written with its table
    v1::TableRouting* t = p.add_tables();
    t->set_table(r.name);
    if (!r.groups.empty()) {
      for (const ColumnGroup& g : r.groups) {
        v1::ColumnGroupRouting* gp = t->add_column_groups();
        gp->set_column_begin(static_cast<uint32_t>(g.begin));
        gp->set_column_end(static_cast<uint32_t>(g.end));
        gp->set_owner(static_cast<uint32_t>(g.owner));
        gp->mutable_backups()->Add(g.backups.begin(), g.backups.end());
      }
    } else if (r.owner >= 0) {
      t->set_owner(static_cast<uint32_t>(r.owner));
      t->mutable_backups()->Add(r.backups.begin(), r.backups.end());
    } else {
      t->mutable_slot_owner()->Add(r.slot_owner.begin(), r.slot_owner.end());
      t->mutable_slot_backups()->Add(r.backups.begin(), r.backups.end());
    }
  }
  return p;
}

int ShardMap::IndexOf(absl::string_view server) const {
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (servers_[i] == server) return static_cast<int>(i);
  }
  return -1;
}

std::vector<uint32_t> ShardMap::SlotsOf(int server) const {
  std::vector<uint32_t> out;
  for (uint32_t slot = 0; slot < num_slots_; ++slot) {
    if (slot_owner_[slot] == static_cast<uint32_t>(server)) out.push_back(slot);
  }
  return out;
}

}  // namespace recps

#include "common/shard_map.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace recps {

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
    if (t.slot_owner_size() == 0) {
      if (t.owner() >= m.servers_.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard map: table ", t.table(), " owned by server index ", t.owner(),
            " of ", m.servers_.size()));
      }
      r.owner = static_cast<int>(t.owner());
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
  return m;
}

TableRoute ShardMap::RouteOf(uint64_t table_key) const {
  TableRoute route;
  route.key_ = table_key;
  route.num_slots_ = num_slots_;
  route.owners_ = slot_owner_.data();
  auto it = std::lower_bound(
      tables_.begin(), tables_.end(), table_key,
      [](const TableRouting& r, uint64_t key) { return r.key < key; });
  if (it != tables_.end() && it->key == table_key) {
    if (it->owner >= 0) {
      route.single_owner_ = it->owner;
    } else {
      route.owners_ = it->slot_owner.data();
    }
  }
  return route;
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
  return m;
}

v1::ShardMap ShardMap::ToProto() const {
  v1::ShardMap p;
  p.set_epoch(epoch_);
  p.set_num_slots(num_slots_);
  for (const std::string& s : servers_) p.add_servers(s);
  p.mutable_slot_owner()->Add(slot_owner_.begin(), slot_owner_.end());
  for (const TableRouting& r : tables_) {
    v1::TableRouting* t = p.add_tables();
    t->set_table(r.name);
    if (r.owner >= 0) {
      t->set_owner(static_cast<uint32_t>(r.owner));
    } else {
      t->mutable_slot_owner()->Add(r.slot_owner.begin(), r.slot_owner.end());
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

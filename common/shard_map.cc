#include "common/shard_map.h"

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
  return m;
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

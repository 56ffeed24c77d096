#include "server/coordinator/member_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recps::server {
namespace {

// The index key of a member that re-registers as the same one; "" for a
// worker without a rank (each registration is a new member).
std::string IndexKey(v1::MemberRole role, const std::string& address, int32_t rank) {
  if (role == v1::SHARD_SERVER) return absl::StrCat("shard ", address);
  if (role == v1::WORKER && rank >= 0) return absl::StrCat("worker ", rank);
  return "";
}

}  // namespace

const char* MemberRoleName(v1::MemberRole role) {
  switch (role) {
    case v1::SHARD_SERVER: return "shard";
    case v1::WORKER: return "worker";
    default: return "unknown";
  }
}

MemberEntry& MemberTable::Add(MemberEntry entry) {
  const v1::MemberRecord& r = entry.record;
  if (std::string key = IndexKey(r.role(), r.address(), r.rank()); !key.empty()) {
    index_[key] = r.member_id();
  }
  // Ids are "<role>-<n>"; a new one never reuses a number still listed.
  const std::string prefix = absl::StrCat(MemberRoleName(r.role()), "-");
  int64_t number = 0;
  if (absl::StartsWith(r.member_id(), prefix) &&
      absl::SimpleAtoi(r.member_id().substr(prefix.size()), &number)) {
    int64_t& next = next_number_[r.role()];
    next = std::max(next, number + 1);
  }
  next_sequence_ = std::max(next_sequence_, r.sequence() + 1);
  const std::string id = r.member_id();
  MemberEntry& stored = members_[id];
  stored = std::move(entry);
  return stored;
}

void MemberTable::Erase(const std::string& member_id) {
  auto it = members_.find(member_id);
  if (it == members_.end()) return;
  const v1::MemberRecord& r = it->second.record;
  if (std::string key = IndexKey(r.role(), r.address(), r.rank()); !key.empty()) {
    auto index = index_.find(key);
    if (index != index_.end() && index->second == member_id) index_.erase(index);
  }
  members_.erase(it);
}

const MemberEntry* MemberTable::Find(const std::string& member_id) const {
  auto it = members_.find(member_id);
  return it == members_.end() ? nullptr : &it->second;
}

const MemberEntry* MemberTable::FindSame(v1::MemberRole role, const std::string& address,
                                         int32_t rank) const {
  const std::string key = IndexKey(role, address, rank);
  if (key.empty()) return nullptr;
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : Find(it->second);
}

v1::MemberRecord MemberTable::NewRecord(v1::MemberRole role) const {
  v1::MemberRecord record;
  auto next = next_number_.find(role);
  record.set_member_id(
      absl::StrCat(MemberRoleName(role), "-", next == next_number_.end() ? 0 : next->second));
  record.set_role(role);
  record.set_sequence(next_sequence_);
  return record;
}

std::vector<std::string> MemberTable::OfClient(const std::string& client) const {
  std::vector<std::string> ids;
  for (const auto& [id, e] : members_) {
    if (e.client == client) ids.push_back(id);
  }
  return ids;
}

std::vector<v1::ServerSpec> MemberTable::CapacitiesOf(
    const std::vector<std::string>& addresses) const {
  std::vector<v1::ServerSpec> capacities;
  for (const std::string& address : addresses) {
    const MemberEntry* e = FindSame(v1::SHARD_SERVER, address, -1);
    capacities.push_back(e != nullptr ? e->record.capacity() : v1::ServerSpec());
  }
  return capacities;
}

}  // namespace recps::server

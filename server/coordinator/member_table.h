// The coordinator's members in memory: each by id, the index that finds
// the member a Register re-registers as (a shard server's address, a
// worker's rank), new ids and registration order, and which members each
// client (a certificate at one address) registered. Not thread-safe: the
// coordinator's lock guards it; the coordinator writes the records through
// to its store.
#ifndef RECPS_SERVER_COORDINATOR_MEMBER_TABLE_H_
#define RECPS_SERVER_COORDINATOR_MEMBER_TABLE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "recps/v1/coordinator.pb.h"

namespace recps::server {

struct MemberEntry {
  v1::MemberRecord record;
  absl::Time last_heartbeat;
  // The per-client key of who registered it ("": unchecked, or loaded
  // from the state before this process).
  std::string client;
  // Shard servers: the newest map epoch at which a heartbeat said no lost
  // primary's clock steps units it owns (0: none said so yet).
  uint64_t lineage_free_epoch = 0;
};

// "shard", "worker" ("unknown" otherwise): how member ids and logs name a role.
const char* MemberRoleName(v1::MemberRole role);

class MemberTable {
 public:
  using Map = absl::flat_hash_map<std::string, MemberEntry>;

  // Adds `entry` under its member id, or replaces the one there; keeps new
  // ids and sequence numbers past every one seen. The entry as stored.
  MemberEntry& Add(MemberEntry entry);
  // Removes the member and its index entry; nothing for an unknown id.
  void Erase(const std::string& member_id);
  // Null for an unknown id.
  const MemberEntry* Find(const std::string& member_id) const;
  MemberEntry* Find(const std::string& member_id) {
    return const_cast<MemberEntry*>(std::as_const(*this).Find(member_id));
  }
  // The member a Register of (role, address, rank) is again: the shard
  // server at `address`, the worker of `rank` (>= 0); null when none.
  const MemberEntry* FindSame(v1::MemberRole role, const std::string& address,
                              int32_t rank) const;
  MemberEntry* FindSame(v1::MemberRole role, const std::string& address, int32_t rank) {
    return const_cast<MemberEntry*>(std::as_const(*this).FindSame(role, address, rank));
  }
  // What each shard server at `addresses` reported of itself at
  // registration (empty for one not registered).
  std::vector<v1::ServerSpec> CapacitiesOf(const std::vector<std::string>& addresses) const;
  // A record for a new member of `role`: its id ("worker-3"), role and
  // registration sequence. Add it to take the id.
  v1::MemberRecord NewRecord(v1::MemberRole role) const;
  // The ids of the members `client` registered.
  std::vector<std::string> OfClient(const std::string& client) const;

  size_t size() const { return members_.size(); }
  Map::iterator begin() { return members_.begin(); }
  Map::iterator end() { return members_.end(); }
  Map::const_iterator begin() const { return members_.begin(); }
  Map::const_iterator end() const { return members_.end(); }

 private:
  Map members_;
  // "shard <address>" / "worker <rank>" -> member id.
  absl::flat_hash_map<std::string, std::string> index_;
  // Next number of a new member id, per role ("shard-<n>", "worker-<n>").
  absl::flat_hash_map<int, int64_t> next_number_;
  int64_t next_sequence_ = 0;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_MEMBER_TABLE_H_

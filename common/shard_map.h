// The cluster's shard map: slot -> owning shard server, with an epoch.
// Plain data, cheap to copy; the proto form (recps.v1.ShardMap) travels on
// the wire and is stored by the coordinator.
#ifndef RECPS_COMMON_SHARD_MAP_H_
#define RECPS_COMMON_SHARD_MAP_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "common/hashing.h"
#include "recps/v1/shard_map.pb.h"

namespace recps {

class ShardMap {
 public:
  ShardMap() = default;

  // Validates: num_slots > 0, at least one server, no duplicate or empty
  // server, slot_owner has num_slots entries each naming a server.
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
  // Index of the server that owns (table, id).
  int OwnerOf(uint64_t table_key, int64_t id) const {
    return slot_owner_[SlotOf(table_key, id, num_slots_)];
  }
  // Index of `server` in servers(), or -1.
  int IndexOf(absl::string_view server) const;
  // The slots owned by server index `server`, ascending.
  std::vector<uint32_t> SlotsOf(int server) const;

 private:
  uint64_t epoch_ = 0;
  uint32_t num_slots_ = 0;
  std::vector<std::string> servers_;
  std::vector<uint32_t> slot_owner_;
};

}  // namespace recps

#endif  // RECPS_COMMON_SHARD_MAP_H_

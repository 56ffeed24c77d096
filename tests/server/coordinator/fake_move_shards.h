// A fake of the shard servers' move RPCs (ShardMoveRpc) for the
// coordinator's orchestration tests: keeps each server's map epoch, records
// every call, and fails on demand (a server down, a copy failing, a
// hand-over answering an error, an export refused for a new backup).
#ifndef RECPS_TESTS_SERVER_COORDINATOR_FAKE_MOVE_SHARDS_H_
#define RECPS_TESTS_SERVER_COORDINATOR_FAKE_MOVE_SHARDS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/wire/shard_map.h"
#include "server/coordinator/move_orchestrator.h"

namespace recps::server {

class FakeMoveShards : public ShardMoveRpc {
 public:
  absl::StatusOr<v1::StatsResponse> Stats(const std::string& address,
                                          absl::Duration) override {
    absl::MutexLock lock(&mu);
    if (down.count(address)) return absl::UnavailableError(address + " is down");
    v1::StatsResponse st;
    auto it = maps.find(address);
    if (it != maps.end()) {
      const ShardMap m = *ShardMap::FromProto(it->second);
      const int self = m.IndexOf(address);
      if (self >= 0) {
        for (uint32_t slot : m.SlotsOf(self)) {
          v1::SlotStats* ss = st.add_slots();
          ss->set_slot(slot);
          ss->set_rows(10);
          ss->set_bytes(1000);
        }
      }
    }
    return st;
  }
  absl::StatusOr<v1::MigrateInResponse> MigrateIn(const std::string& address,
                                                  const v1::MigrateInRequest& request,
                                                  absl::Duration) override {
    absl::MutexLock lock(&mu);
    migrate_ins.push_back({address, request});
    if (down.count(address)) return absl::UnavailableError(address + " is down");
    if (fail_copy.count(address)) return absl::InternalError("disk full");
    v1::MigrateInResponse r;
    r.set_rows(10 * request.slots_size());
    r.set_bytes(1000 * request.slots_size());
    r.set_seconds(0.5);
    return r;
  }
  absl::StatusOr<v1::AllowExportResponse> AllowExport(const std::string& address,
                                                      const v1::AllowExportRequest& request,
                                                      absl::Duration) override {
    absl::MutexLock lock(&mu);
    grants.push_back({address, request});
    if (down.count(address)) return absl::UnavailableError(address + " is down");
    if (request.for_backup()) {
      // As a shard server: no new backup for units it got by promotion.
      for (uint32_t slot : request.slots()) {
        if (promoted[address].count(slot)) {
          return absl::FailedPreconditionError(absl::StrCat(
              address, ": slot ", slot, " steps on the clock of a lost primary"));
        }
      }
    }
    return v1::AllowExportResponse();
  }
  absl::StatusOr<v1::HandOverResponse> HandOver(const std::string& address,
                                                const v1::HandOverRequest& request,
                                                absl::Duration) override {
    absl::MutexLock lock(&mu);
    auto hold = [this] {
      mu.AssertHeld();
      return !block_handover;
    };
    mu.Await(absl::Condition(&hold));
    handovers.push_back({address, request});
    if (handover_error.ok()) {
      maps[request.target()] = request.new_map();
      maps[address] = request.new_map();
      v1::HandOverResponse r;
      r.set_delta_rows(3);
      return r;
    }
    if (target_installs_anyway) maps[request.target()] = request.new_map();
    if (target_dies_at_handover) down.insert(request.target());
    return handover_error;
  }
  absl::StatusOr<v1::AbortMoveResponse> AbortMove(const std::string& address,
                                                  const v1::AbortMoveRequest& request,
                                                  absl::Duration) override {
    absl::MutexLock lock(&mu);
    if (down.count(address)) return absl::UnavailableError(address + " is down");
    aborts.push_back({address, request.move_id()});
    return v1::AbortMoveResponse();
  }
  absl::StatusOr<v1::ListMovesResponse> ListMoves(const std::string& address,
                                                  absl::Duration) override {
    absl::MutexLock lock(&mu);
    if (down.count(address)) return absl::UnavailableError(address + " is down");
    return v1::ListMovesResponse();
  }
  absl::StatusOr<v1::ShardMap> GetShardMap(const std::string& address,
                                           absl::Duration) override {
    absl::MutexLock lock(&mu);
    if (down.count(address)) return absl::UnavailableError(address + " is down");
    return maps[address];
  }

  absl::Mutex mu;
  std::map<std::string, v1::ShardMap> maps;
  std::set<std::string> down, fail_copy;
  // Per server: slots it refuses to export for a new backup.
  std::map<std::string, std::set<uint32_t>> promoted;
  absl::Status handover_error;
  bool target_installs_anyway = false;
  // A failed hand-over's target stops answering (it died meanwhile).
  bool target_dies_at_handover = false;
  bool block_handover = false;
  std::vector<std::pair<std::string, v1::MigrateInRequest>> migrate_ins;
  std::vector<std::pair<std::string, v1::AllowExportRequest>> grants;
  std::vector<std::pair<std::string, v1::HandOverRequest>> handovers;
  std::vector<std::pair<std::string, std::string>> aborts;
};

}  // namespace recps::server

#endif  // RECPS_TESTS_SERVER_COORDINATOR_FAKE_MOVE_SHARDS_H_

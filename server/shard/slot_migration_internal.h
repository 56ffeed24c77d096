// What the two halves of SlotMoves share (slot_migration.cc:
// the target side and the bookkeeping; slot_migration_source.cc: ExportRows
// and HandOver). Included by those two files only.
#ifndef RECPS_SERVER_SHARD_SLOT_MIGRATION_INTERNAL_H_
#define RECPS_SERVER_SHARD_SLOT_MIGRATION_INTERNAL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/shard/slot_moves.h"

namespace recps::server {

struct SlotMoves::Move {
  std::string id;
  bool target = true;  // this server's role
  bool as_backup = false;  // re-replication: the target becomes a backup
  std::string peer;
  std::vector<Unit> units;  // sorted
  std::vector<uint32_t> slots;
  std::vector<std::string> tables;
  int64_t max_bytes_per_second = 0;
  v1::MoveState::Phase phase = v1::MoveState::COPYING;
  int64_t rows = 0;
  int64_t bytes = 0;
  std::string error;
  uint64_t last_mark = 0;  // target: the last copy round's mark
  uint64_t new_epoch = 0;  // the map that handed it over
  bool abort_requested = false;
  bool running = false;  // a thread works on it
  absl::Time start;
  double seconds = 0;
  std::shared_ptr<ShardPeer> link;
  std::vector<std::pair<v1::MigrateInResponse*, Done>> copy_waiters;
  std::vector<std::pair<v1::AbortMoveResponse*, Done>> abort_waiters;
};

namespace slot_migration {

// Largest ExportRows chunk a caller may ask for.
inline constexpr int64_t kMaxChunkBytes = int64_t{16} << 20;
// Finished moves ListMoves remembers.
inline constexpr size_t kMaxMoveRecords = 1000;

inline const char* PhaseName(v1::MoveState::Phase phase) {
  return v1::MoveState::Phase_Name(phase).c_str();
}

// The map a move hands its units over with (HandOver on the source,
// FinishMove on the target): INVALID_ARGUMENT for another slot count or an
// epoch far past the current one (kMaxShardMapEpochStep),
// FAILED_PRECONDITION when it is not newer than `current_epoch`.
absl::StatusOr<ShardMap> ParseNewMap(const v1::ShardMap& proto, uint32_t num_slots,
                                     uint64_t current_epoch);

}  // namespace slot_migration
}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SLOT_MIGRATION_INTERNAL_H_

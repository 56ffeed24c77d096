// What the two halves of ShardServer's slot moves share (slot_migration.cc:
// the target side and the bookkeeping; slot_migration_source.cc: ExportRows
// and HandOver). Included by those two files only.
#ifndef RECPS_SERVER_SHARD_SLOT_MIGRATION_INTERNAL_H_
#define RECPS_SERVER_SHARD_SLOT_MIGRATION_INTERNAL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/shard/shard_server.h"

namespace recps::server {

struct ShardServer::Move {
  std::string id;
  bool target = true;  // this server's role
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

struct ShardServer::Hold {
  // [table][slot]: 1 when held (tables not in the move: empty).
  std::vector<std::vector<uint8_t>> held;
  // Sync and bounded: lookups (and pushes) of this step and later wait;
  // async: every step (0).
  int64_t from_step = 0;
  // Sync and bounded, a target that owns nothing yet: every push of
  // from_step or later waits, whatever its ids (see RunHandOver).
  bool all_pushes = false;
  std::vector<absl::AnyInvocable<void() &&>> parked;
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

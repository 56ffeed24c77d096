// SlotMoves, the source's side: ExportRows (the rows of the
// moving units, chunk by chunk, from a generation mark) and HandOver (hold
// the units at a step boundary, have the target finish, install the new map,
// drop the rows, release the held requests). The target's side and the
// bookkeeping are in slot_migration.cc; the protocol in
// proto/recps/v1/shard_admin.proto.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/hashing.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/wire/wire_format.h"
#include "kernels/embedding_optimizer.h"
#include "server/shard/slot_moves.h"
#include "server/shard/slot_migration_internal.h"

namespace recps::server {

using slot_migration::kMaxChunkBytes;
using slot_migration::kMaxMoveRecords;
using slot_migration::PhaseName;

// ---- Source: ExportRows ----

absl::StatusOr<std::unique_ptr<SlotMoves::RowExport>> SlotMoves::StartExport(
    const v1::ExportRowsRequest& request) {
  RETURN_IF_ERROR(export_grants_.Check(request));
  const MapView view = CurrentMap();
  if (view->self < 0) {
    return absl::FailedPreconditionError(
        "this server has no shard map that lists it");
  }
  if (request.max_chunk_bytes() < 0 || request.max_chunk_bytes() > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_chunk_bytes is ", request.max_chunk_bytes(), "; allowed 0 (",
        options_.move_chunk_bytes, ") to ", kMaxChunkBytes));
  }
  const std::vector<uint32_t> slots(request.slots().begin(), request.slots().end());
  const std::vector<std::string> tables(request.tables().begin(),
                                        request.tables().end());
  auto exp = std::make_unique<RowExport>();
  ASSIGN_OR_RETURN(exp->units,
                   ResolveUnits(view, slots, tables, view->self_address));
  exp->since = request.since();
  exp->max_bytes = request.max_chunk_bytes() > 0 ? request.max_chunk_bytes()
                                                 : options_.move_chunk_bytes;
  // Taken before any row is read: a row changed while this export runs
  // carries a later generation, so the next export (since = mark) has it.
  exp->mark = snapshots_->NextMark();
  return exp;
}

absl::StatusOr<bool> SlotMoves::NextExportChunk(RowExport& exp,
                                                  v1::ExportRowsChunk* chunk) {
  chunk->Clear();
  chunk->set_mark(exp.mark);
  int64_t bytes = 0;
  while (exp.next < exp.units.size() && bytes < exp.max_bytes) {
    const Unit& u = exp.units[exp.next];
    const config::TableSpec& spec = store_->spec(u.first);
    const int64_t row_bytes =
        FusedRowStride(spec.optimizer.kind, spec.dim) *
        static_cast<int64_t>(sizeof(float));
    const int64_t budget = std::max<int64_t>(1, (exp.max_bytes - bytes) / row_bytes);
    RETURN_IF_ERROR(store_->ExportChangedSlot(u.first, u.second, exp.since,
                                              &exp.cursor, budget, &exp.scratch));
    if (!exp.scratch.ids.empty()) {
      v1::SlotRows* part = chunk->add_parts();
      part->set_table(spec.name);
      part->set_slot(u.second);
      part->set_row_stride(static_cast<int32_t>(exp.scratch.row_stride));
      EncodeIds(exp.scratch.ids, part->mutable_ids());
      part->mutable_rows()->assign(
          reinterpret_cast<const char*>(exp.scratch.rows.data()),
          exp.scratch.rows.size() * sizeof(float));
      bytes += static_cast<int64_t>(part->rows().size());
      exp.rows_sent += static_cast<int64_t>(exp.scratch.ids.size());
    }
    if (exp.cursor.done) {
      ++exp.next;
      exp.cursor = SlotCursor();
    }
  }
  if (chunk->parts_size() == 0 && exp.sent_any) return false;
  exp.sent_any = true;  // an export without rows still sends its mark
  chunk->set_rows_sent(exp.rows_sent);
  return true;
}

// ---- Source: HandOver ----

void SlotMoves::HandOver(const v1::HandOverRequest* request,
                           v1::HandOverResponse* response, Done done) {
  if (request->move_id().empty() || request->target().empty()) {
    std::move(done)(absl::InvalidArgumentError("move_id and target are required"));
    return;
  }
  if (!options_.connect_peer) {
    std::move(done)(absl::FailedPreconditionError(
        "this server cannot reach other shard servers (no connect_peer)"));
    return;
  }
  absl::MutexLock lock(&moves_mu_);
  if (moves_stop_) {
    std::move(done)(absl::UnavailableError("shard server is shutting down"));
    return;
  }
  if (std::shared_ptr<Move> m = FindMove(request->move_id(), false);
      m != nullptr && m->phase == v1::MoveState::HANDED_OVER &&
      m->new_epoch == request->new_map().epoch()) {
    std::move(done)(absl::OkStatus());  // a retry of a finished hand-over
    return;
  }
  if (handing_over_) {
    std::move(done)(absl::FailedPreconditionError(
        "another hand-over is in progress on this server; retry after it"));
    return;
  }
  handing_over_ = true;
  auto move = std::make_shared<Move>();
  move->id = request->move_id();
  move->target = false;
  move->as_backup = request->add_backup();
  move->peer = request->target();
  move->phase = v1::MoveState::HANDING_OVER;
  move->start = absl::Now();
  move->running = true;
  move->link = options_.connect_peer(move->peer);
  moves_.push_back(move);
  StartMoveThread([this, move, request, response, done = std::move(done)]() mutable {
    absl::Status s = RunHandOver(*request, response);
    {
      absl::MutexLock lock(&moves_mu_);
      handing_over_ = false;
      move->running = false;
      move->seconds = absl::ToDoubleSeconds(absl::Now() - move->start);
      if (s.ok()) {
        move->phase = v1::MoveState::HANDED_OVER;
        move->new_epoch = request->new_map().epoch();
        move->rows = response->delta_rows();
      } else {
        move->phase = v1::MoveState::FAILED;
        move->error = std::string(s.message());
      }
    }
    LogInfo("move ", move->id, ": hand-over to ", move->peer, " ",
            s.ok() ? absl::StrCat("done (", response->delta_rows(),
                                  " rows at the end, held ",
                                  response->hold_seconds(), " s)")
                   : absl::StrCat("failed: ", s.message()));
    std::move(done)(s);
  });
}

absl::Status SlotMoves::RunHandOver(const v1::HandOverRequest& request,
                                      v1::HandOverResponse* response) {
  const MapView view = CurrentMap();
  const std::string self =
      request.self().empty() ? view->self_address : request.self();
  if (view->self < 0 || self != view->self_address) {
    return absl::InvalidArgumentError(absl::StrCat(
        "self ", self, " is not this server (", view->self_address,
        ") or this server has no map"));
  }
  if (request.target() == self) {
    return absl::InvalidArgumentError(absl::StrCat(
        "move ", request.move_id(), ": target ", self,
        " is this server: a move to self"));
  }
  ASSIGN_OR_RETURN(ShardMap next, slot_migration::ParseNewMap(request.new_map(), options_.num_slots,
                                                              view->map.epoch()));
  if (next.IndexOf(request.target()) < 0 || next.IndexOf(self) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "new_map (epoch ", next.epoch(), ") must list this server ", self,
        " and the target ", request.target()));
  }
  const bool add_backup = request.add_backup();
  ASSIGN_OR_RETURN(const std::vector<Unit> units,
                   add_backup ? BackupDiff(view->map, next, self, request.target())
                              : MoveDiff(view->map, next, self, request.target()));
  // A new backup follows this server's own clock (JoinAsBackup).
  if (add_backup) RETURN_IF_ERROR(replication_->CheckOwnClock(units));

  // The hold: requests touching the units from now on wait. In sync and
  // bounded modes only lookups of steps after every lookup already seen
  // (and pushes of those steps); pushes of earlier steps must still come.
  auto hold = std::make_shared<UnitHolds::Hold>();
  hold->held.resize(store_->num_tables());
  for (const Unit& u : units) {
    if (hold->held[u.first].empty()) hold->held[u.first].assign(options_.num_slots, 0);
    hold->held[u.first][u.second] = 1;
  }
  const bool async = options_.consistency.mode == ConsistencyMode::kAsync;
  // A target that owns nothing took part in no step so far: the workers do
  // not push to it (client/embedding_client.cc). It joins at step L + 1
  // (FinishMove adopts L), so from L + 1 on every worker's push must reach
  // it: one routed by the current map would not. Every push of a step after
  // L is held here and refused as stale once new_map is installed, so the
  // worker refreshes the map and pushes that step to the target too. L
  // counts pushes as well as lookups: no push of a later step was accepted
  // here before the hold (a worker's lookups of a step may all go to other
  // servers).
  // Re-replication: the target's clock of this server joins at L + 1 (or
  // takes every push already), and this server forwards by the map a push
  // was accepted under; so every push of a step after L is held and, as
  // stale once new_map is installed, sent again by new_map, which lists
  // the new backup: it sees each worker arrive at each step from L + 1.
  hold->all_pushes = !async && (add_backup || !view->map.OwnsAnything(
                                                  view->map.IndexOf(request.target())));
  const int64_t last_step = holds_->Add(hold, async);
  const absl::Time held_at = absl::Now();
  // Nothing pending for the units after this: async, the pushes in flight
  // finish (the gate); sync/bounded, every step a served lookup belongs to
  // is applied.
  if (async) {
    holds_->WaitForPushesInFlight();
  } else {
    // In slices, so that a shutdown does not wait for the step timeout.
    const absl::Time give_up = absl::Now() + options_.consistency.step_timeout;
    absl::Status s;
    for (;;) {
      const absl::Duration left = give_up - absl::Now();
      s = clock_->WaitApplied(last_step,
                              std::max(absl::ZeroDuration(),
                                       std::min(left, absl::Milliseconds(200))));
      if (!absl::IsDeadlineExceeded(s) || left <= absl::ZeroDuration()) break;
      absl::MutexLock lock(&moves_mu_);
      if (moves_stop_) {
        s = absl::UnavailableError("shard server is shutting down");
        break;
      }
    }
    if (!s.ok()) {
      holds_->Release(hold);
      return absl::Status(s.code(), absl::StrCat(
          "hand-over of move ", request.move_id(), ": ", s.message(),
          "; this server keeps the slots"));
    }
  }
  std::shared_ptr<ShardPeer> link;
  {
    absl::MutexLock lock(&moves_mu_);
    link = FindMove(request.move_id(), false)->link;
  }
  v1::FinishMoveRequest finish;
  finish.set_move_id(request.move_id());
  *finish.mutable_new_map() = request.new_map();
  finish.set_source(self);
  finish.set_add_backup(add_backup);
  if (!async) {
    finish.set_source_step(last_step);
    finish.set_has_source_step(true);
  }
  absl::StatusOr<v1::FinishMoveResponse> finished =
      link->FinishMove(finish, options_.move_rpc_timeout);
  if (!finished.ok()) {
    // Did the target install new_map? Its AbortMove says: refused as
    // handed over means it did; OK or NOT_FOUND means it never will.
    v1::AbortMoveRequest abort;
    abort.set_move_id(request.move_id());
    absl::StatusOr<v1::AbortMoveResponse> aborted =
        link->AbortMove(abort, absl::Seconds(10));
    if (!absl::IsFailedPrecondition(aborted.status())) {
      holds_->Release(hold);
      return absl::Status(
          finished.status().code(),
          absl::StrCat("hand-over of move ", request.move_id(), " to ",
                       request.target(), " failed: ",
                       finished.status().message(),
                       add_backup ? "; the units keep their backups of epoch "
                                  : "; this server keeps the slots at epoch ",
                       view->map.epoch(),
                       aborted.ok() || absl::IsNotFound(aborted.status())
                           ? " (the target dropped its copy)"
                           : absl::StrCat(" (aborting on the target failed "
                                          "too: ",
                                          aborted.status().message(), ")")));
    }
    LogWarning("move ", request.move_id(), ": FinishMove failed (",
               finished.status().message(),
               ") but the target installed the new map: completing");
    finished = v1::FinishMoveResponse();
  }
  v1::SetShardMapRequest set;
  *set.mutable_shard_map() = request.new_map();
  set.set_self(self);
  // A backup added keeps the units here: nothing handed over, no rows dropped.
  const absl::flat_hash_set<Unit> handed =
      add_backup ? absl::flat_hash_set<Unit>() : absl::flat_hash_set<Unit>(units.begin(), units.end());
  absl::Status installed = map_->Install(set, add_backup ? nullptr : &handed);
  // Held requests now get the stale-epoch error: release them before the
  // drop (a compaction of the arena, about a memcpy of the moved rows).
  holds_->Release(hold);
  const double hold_seconds = absl::ToDoubleSeconds(absl::Now() - held_at);
  if (installed.ok() && !add_backup) snapshots_->DropHandedOver(units);
  if (!installed.ok()) {
    return absl::InternalError(absl::StrCat(
        "move ", request.move_id(), ": the target ", add_backup ? "backs" : "owns",
        " the units at epoch ",
        next.epoch(), ", but installing that map here failed: ",
        installed.message()));
  }
  response->set_delta_rows(finished->delta_rows());
  response->set_hold_seconds(hold_seconds);
  return absl::OkStatus();
}

}  // namespace recps::server

// SlotMoves (ShardAdmin MigrateIn, HandOver, AbortMove,
// ListMoves, and the shard-to-shard ExportRows and FinishMove). The
// protocol is in proto/recps/v1/shard_admin.proto; the operator's view in
// docs/operations.md ("Slot migration: the servers").
//
// Target: MigrateIn pulls the units' rows from the source (ExportRows from
// a generation mark: a full round, then rounds of the rows changed since
// the previous round's mark), imports them without serving them (its map
// does not give it the units), and answers. FinishMove (called by the
// source's HandOver) pulls the rows changed since the last round and
// installs new_map.
// Source: HandOver holds the units (lookups of later steps, and in async
// mode every push, touching them wait), waits until nothing is pending for
// them, has the target finish, installs new_map, drops the rows and
// releases the held requests, which then get the stale-epoch error.
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

absl::StatusOr<std::vector<SlotMoves::Unit>> SlotMoves::ResolveUnits(
    const MapView& view, absl::Span<const uint32_t> slots,
    absl::Span<const std::string> tables, const std::string& owner) const {
  const uint32_t num_slots = options_.num_slots;
  const v1::ShardMap proto = view->map.ToProto();
  absl::flat_hash_set<uint32_t> seen;
  std::vector<Unit> units;
  bool no_row_wise = false;
  for (uint32_t slot : slots) {
    if (slot >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot ", slot, " is out of range: this cluster has ", num_slots,
          " slots [0, ", num_slots, ")"));
    }
    if (!seen.insert(slot).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", slot, " is listed twice"));
    }
    // The slot's share of every row-wise table the owner holds it of (a
    // table routed by its own slot owners may give it to another server).
    bool any = false;
    int row_wise = 0;
    for (int t = 0; t < store_->num_base_tables(); ++t) {
      const TableRoute route =
          view->map.RouteOf(StableNameKey(store_->spec(t).name));
      if (route.column_split() || route.single_owner() >= 0) continue;
      ++row_wise;
      if (map_->UnitOwner(view->map, proto, {t, slot}) != owner) continue;
      units.emplace_back(t, slot);
      any = true;
    }
    if (row_wise == 0) {
      // A planned map keeps slot owners with every table whole: a drain
      // hands the slots over (they hold no row) beside the tables it moves,
      // and a move's later copy streams carry only slots.
      no_row_wise = true;
      continue;
    }
    if (!any) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slot ", slot, " is owned by ",
          view->map.servers()[view->map.OwnerOfSlot(slot)], ", not by ", owner,
          " at shard map epoch ", view->map.epoch(),
          " (no row-wise table's share of it is); nothing changed"));
    }
  }
  for (const std::string& name : tables) {
    ASSIGN_OR_RETURN(const int t, store_->FindTable(name));
    if (t >= store_->num_base_tables() ||
        view->map.RouteOf(StableNameKey(name)).column_split()) {
      return absl::UnimplementedError(absl::StrCat(
          "table ", name, " is split column-wise (or is a column group): "
          "moving column groups is not supported yet"));
    }
    for (uint32_t slot = 0; slot < num_slots; ++slot) units.emplace_back(t, slot);
  }
  std::sort(units.begin(), units.end());
  units.erase(std::unique(units.begin(), units.end()), units.end());
  if (units.empty() && no_row_wise) return units;  // routing only, no rows
  if (units.empty()) {
    return absl::InvalidArgumentError(
        slots.empty() && tables.empty()
            ? "the move names no slots and no tables"
            : "the move's slots hold no row-wise table (every table is "
              "table-wise or split column-wise): name tables instead");
  }
  int64_t wrong = 0;
  std::string first;
  for (const Unit& u : units) {
    const std::string o = map_->UnitOwner(view->map, proto, u);
    if (o == owner) continue;
    if (wrong++ == 0) {
      first = absl::StrCat("slot ", u.second, " of table ",
                           store_->spec(u.first).name, " is owned by ",
                           o.empty() ? "its column groups" : o);
    }
  }
  if (wrong > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        first, ", not by ", owner, " at shard map epoch ", view->map.epoch(),
        wrong > 1 ? absl::StrCat(" (and ", wrong - 1, " more units)") : "",
        "; nothing changed"));
  }
  return units;
}

absl::StatusOr<std::vector<SlotMoves::Unit>> SlotMoves::MoveDiff(
    const ShardMap& current, const ShardMap& next, const std::string& from,
    const std::string& to) const {
  const v1::ShardMap cur_proto = current.ToProto();
  const v1::ShardMap next_proto = next.ToProto();
  std::vector<Unit> units;
  for (int t = 0; t < store_->num_base_tables(); ++t) {
    for (uint32_t slot = 0; slot < options_.num_slots; ++slot) {
      const Unit u(t, slot);
      const std::string a = map_->UnitOwner(current, cur_proto, u);
      const std::string b = map_->UnitOwner(next, next_proto, u);
      if (a == b) continue;
      if (a == from && b == to) {
        units.push_back(u);
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "new_map (epoch ", next.epoch(), ") also moves slot ", slot,
          " of table ", store_->spec(t).name, " from ",
          a.empty() ? "column groups" : a, " to ",
          b.empty() ? "column groups" : b, "; a hand-over's map may only "
          "move units from ", from, " to ", to, " (current epoch ",
          current.epoch(), ")"));
    }
  }
  if (units.empty()) {
    // Slot owners that route no row (every table whole: ResolveUnits)
    // change hands with no unit.
    for (uint32_t slot = 0; slot < options_.num_slots; ++slot) {
      if (current.servers()[current.OwnerOfSlot(slot)] == from &&
          next.servers()[next.OwnerOfSlot(slot)] == to) {
        return units;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "new_map (epoch ", next.epoch(), ") moves nothing from ", from,
        " to ", to));
  }
  return units;
}

SlotMoves::~SlotMoves() { Stop(); }

std::shared_ptr<SlotMoves::Move> SlotMoves::FindMove(const std::string& id,
                                                        bool target) const {
  for (auto it = moves_.rbegin(); it != moves_.rend(); ++it) {
    if ((*it)->id == id && (*it)->target == target) return *it;
  }
  return nullptr;
}

void SlotMoves::StartMoveThread(absl::AnyInvocable<void() &&> fn) {
  // Joins the threads that ended, so a long job's moves leave none behind.
  for (size_t i = 0; i < move_threads_.size();) {
    if (move_threads_[i].second->load()) {
      move_threads_[i].first.join();
      move_threads_[i] = std::move(move_threads_.back());
      move_threads_.pop_back();
    } else {
      ++i;
    }
  }
  auto ended = std::make_shared<std::atomic<bool>>(false);
  move_threads_.emplace_back(
      std::thread([fn = std::move(fn), ended]() mutable {
        std::move(fn)();
        ended->store(true);
      }),
      ended);
}

void SlotMoves::Stop() {
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> threads;
  {
    absl::MutexLock lock(&moves_mu_);
    moves_stop_ = true;
    for (const auto& m : moves_) {
      if (m->link != nullptr) m->link->Shutdown();
    }
    threads.swap(move_threads_);
  }
  for (auto& t : threads) t.first.join();
}

// ---- Target: MigrateIn, FinishMove, AbortMove ----

void SlotMoves::MigrateIn(const v1::MigrateInRequest* request,
                            v1::MigrateInResponse* response, Done done) {
  const MapView view = CurrentMap();
  absl::Status s;
  if (request->move_id().empty()) {
    s = absl::InvalidArgumentError("move_id is empty");
  } else if (request->source().empty()) {
    s = absl::InvalidArgumentError("source is empty");
  } else if (request->max_bytes_per_second() < 0) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "max_bytes_per_second is ", request->max_bytes_per_second(),
        "; it must be >= 0 (0: no limit)"));
  } else if (!options_.connect_peer) {
    s = absl::FailedPreconditionError(
        "this server cannot reach other shard servers (no connect_peer)");
  } else if (view->self < 0) {
    s = absl::FailedPreconditionError(
        "this server has no shard map that lists it yet");
  } else if (request->source() == view->self_address) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "move ", request->move_id(), ": source ", request->source(),
        " is this server: a move to self"));
  } else if (view->map.IndexOf(request->source()) < 0) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "source ", request->source(), " is not in shard map epoch ",
        view->map.epoch()));
  } else if (request->epoch() != 0 && request->epoch() != view->map.epoch()) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "move ", request->move_id(), " was planned at shard map epoch ",
        request->epoch(), "; this server is at epoch ", view->map.epoch()));
  }
  if (!s.ok()) {
    std::move(done)(s);
    return;
  }
  const std::vector<uint32_t> slots(request->slots().begin(),
                                    request->slots().end());
  const std::vector<std::string> tables(request->tables().begin(),
                                        request->tables().end());
  absl::StatusOr<std::vector<Unit>> units =
      ResolveUnits(view, slots, tables, request->source());
  if (units.ok() && request->as_backup()) {
    if (absl::Status copy = CheckNotACopy(view->map, *units, view->self_address); !copy.ok()) {
      units = copy;
    }
  }
  if (!units.ok()) {
    std::move(done)(units.status());
    return;
  }
  absl::MutexLock lock(&moves_mu_);
  if (moves_stop_) {
    std::move(done)(absl::UnavailableError("shard server is shutting down"));
    return;
  }
  if (std::shared_ptr<Move> m = FindMove(request->move_id(), true)) {
    if (m->units != *units || m->peer != request->source() ||
        m->as_backup != request->as_backup()) {
      std::move(done)(absl::InvalidArgumentError(absl::StrCat(
          "move ", m->id, " already exists with other units or source")));
      return;
    }
    switch (m->phase) {
      case v1::MoveState::COPIED:
      case v1::MoveState::HANDED_OVER:
        response->set_rows(m->rows);
        response->set_bytes(m->bytes);
        response->set_seconds(m->seconds);
        std::move(done)(absl::OkStatus());
        return;
      case v1::MoveState::COPYING:
        m->copy_waiters.emplace_back(response, std::move(done));
        return;
      default:
        break;  // failed or aborted: copy again under a new record
    }
  }
  absl::flat_hash_set<Unit> mine(units->begin(), units->end());
  for (const auto& other : moves_) {
    if (!other->target || other->id == request->move_id()) continue;
    if (other->phase != v1::MoveState::COPYING &&
        other->phase != v1::MoveState::COPIED) {
      continue;
    }
    for (const Unit& u : other->units) {
      if (mine.contains(u)) {
        std::move(done)(absl::FailedPreconditionError(absl::StrCat(
            "slot ", u.second, " of table ", store_->spec(u.first).name,
            " is already being moved here by move ", other->id, " (",
            PhaseName(other->phase), "); abort it first")));
        return;
      }
    }
  }
  auto move = std::make_shared<Move>();
  move->id = request->move_id();
  move->peer = request->source();
  move->as_backup = request->as_backup();
  move->units = *std::move(units);
  move->slots = slots;
  move->tables = tables;
  move->max_bytes_per_second = request->max_bytes_per_second();
  move->start = absl::Now();
  move->running = true;
  move->link = options_.connect_peer(move->peer);
  move->copy_waiters.emplace_back(response, std::move(done));
  moves_.push_back(move);
  while (moves_.size() > kMaxMoveRecords && !moves_.front()->running &&
         moves_.front()->phase != v1::MoveState::COPIED) {
    moves_.erase(moves_.begin());
  }
  LogInfo("move ", move->id, ": copying ", move->units.size(), " unit(s) from ", move->peer,
          move->as_backup ? " to back them up (re-replication)" : "");
  StartMoveThread([this, move] {
    const absl::Status status = RunCopy(move);
    std::vector<std::pair<v1::MigrateInResponse*, Done>> waiters;
    std::vector<std::pair<v1::AbortMoveResponse*, Done>> aborts;
    absl::Status result = status;
    {
      absl::MutexLock lock(&moves_mu_);
      move->running = false;
      move->seconds = absl::ToDoubleSeconds(absl::Now() - move->start);
      if (status.ok() && !move->abort_requested) {
        move->phase = v1::MoveState::COPIED;
      } else {
        const int64_t dropped = DropUnits(*store_, move->units);
        if (move->abort_requested) {
          move->phase = v1::MoveState::ABORTED;
          result = absl::AbortedError(
              absl::StrCat("move ", move->id, " was aborted"));
        } else {
          move->phase = v1::MoveState::FAILED;
        }
        move->error = std::string(result.message());
        for (auto& a : move->abort_waiters) a.first->set_rows(dropped);
      }
      waiters.swap(move->copy_waiters);
      aborts.swap(move->abort_waiters);
      for (auto& [r, d] : waiters) {
        r->set_rows(move->rows);
        r->set_bytes(move->bytes);
        r->set_seconds(move->seconds);
      }
    }
    LogInfo("move ", move->id, ": copy ",
            result.ok() ? "done" : absl::StrCat("ended: ", result.message()),
            " (", move->rows, " rows, ", move->bytes, " bytes)");
    for (auto& [r, d] : waiters) std::move(d)(result);
    for (auto& [r, d] : aborts) std::move(d)(absl::OkStatus());
  });
}

absl::Status SlotMoves::PullRows(const std::shared_ptr<Move>& move,
                                   uint64_t since, uint64_t* mark,
                                   int64_t* rows, bool rate_limited) {
  // Streams in parallel, each over every k-th slot (whole tables go with
  // the first): one stream is one chunk in flight, which leaves the wire
  // idle while either side builds or imports a chunk.
  const int streams = static_cast<int>(std::max<size_t>(
      1, std::min<size_t>(options_.move_streams, move->slots.size())));
  std::vector<uint64_t> marks(streams, 0);
  std::vector<int64_t> counts(streams, 0);
  std::vector<absl::Status> results(streams);
  const absl::Time start = absl::Now();
  std::atomic<int64_t> pulled_bytes{0};
  auto run = [&](int k) {
    v1::ExportRowsRequest request;
    request.set_move_id(move->id);
    for (size_t i = k; i < move->slots.size(); i += streams) {
      request.add_slots(move->slots[i]);
    }
    if (k == 0) {
      for (const std::string& t : move->tables) request.add_tables(t);
    }
    if (request.slots_size() == 0 && request.tables_size() == 0) return;
    request.set_since(since);
    request.set_max_chunk_bytes(options_.move_chunk_bytes);
    results[k] = PullStream(move, request, start, &pulled_bytes, &marks[k],
                            &counts[k], rate_limited);
  };
  std::vector<std::thread> helpers;
  for (int k = 1; k < streams; ++k) helpers.emplace_back(run, k);
  run(0);
  for (std::thread& t : helpers) t.join();
  *rows = 0;
  *mark = 0;
  for (int k = 0; k < streams; ++k) {
    RETURN_IF_ERROR(results[k]);
    *rows += counts[k];
    // The earliest: a row changed after it may have been missed by the
    // streams that took their mark later (they read after their marks, so
    // they did not miss it, but the next round reads it again: harmless).
    if (marks[k] != 0 && (*mark == 0 || marks[k] < *mark)) *mark = marks[k];
  }
  return absl::OkStatus();
}

absl::Status SlotMoves::PullStream(const std::shared_ptr<Move>& move,
                                     const v1::ExportRowsRequest& request,
                                     absl::Time start,
                                     std::atomic<int64_t>* pulled,
                                     uint64_t* mark, int64_t* rows,
                                     bool rate_limited) {
  const absl::flat_hash_set<Unit> units(move->units.begin(), move->units.end());
  *rows = 0;
  *mark = 0;
  std::vector<int64_t> ids_scratch;
  std::vector<float> rows_scratch;
  return move->link->ExportRows(
      request, options_.move_rpc_timeout,
      [&](v1::ExportRowsChunk& chunk) -> absl::Status {
        {
          absl::MutexLock lock(&moves_mu_);
          if (move->abort_requested) {
            return absl::AbortedError(absl::StrCat("move ", move->id, " was aborted"));
          }
          if (moves_stop_) return absl::UnavailableError("shard server is shutting down");
        }
        if (chunk.mark() == 0) {
          return absl::DataLossError("the source sent a chunk without a mark");
        }
        *mark = chunk.mark();
        int64_t chunk_rows = 0, chunk_bytes = 0;
        for (const v1::SlotRows& part : chunk.parts()) {
          ASSIGN_OR_RETURN(const int table, store_->FindTable(part.table()));
          if (!units.contains(Unit(table, part.slot()))) {
            return absl::DataLossError(absl::StrCat(
                "the source sent rows of slot ", part.slot(), " of table ",
                part.table(), ", which move ", move->id, " does not move"));
          }
          const config::TableSpec& spec = store_->spec(table);
          const int64_t stride = FusedRowStride(spec.optimizer.kind, spec.dim);
          if (part.row_stride() != stride) {
            return absl::FailedPreconditionError(absl::StrCat(
                "table ", spec.name, ": the source's rows are ", part.row_stride(),
                " floats wide, this server's ", stride,
                " (different dim or optimizer: the servers' table configs differ)"));
          }
          absl::Span<const int64_t> ids;
          RETURN_IF_ERROR(DecodeIds(part.ids(), "ExportRowsChunk ids",
                                    &ids_scratch, &ids));
          const size_t want = ids.size() * stride * sizeof(float);
          if (part.rows().size() != want) {
            return absl::DataLossError(absl::StrCat(
                "table ", spec.name, " slot ", part.slot(), ": ", ids.size(),
                " ids but ", part.rows().size(), " bytes of rows (expected ",
                want, ")"));
          }
          const float* data = reinterpret_cast<const float*>(part.rows().data());
          if (reinterpret_cast<uintptr_t>(data) % alignof(float) != 0) {
            rows_scratch.resize(ids.size() * stride);
            std::memcpy(rows_scratch.data(), part.rows().data(), want);
            data = rows_scratch.data();
          }
          RETURN_IF_ERROR(store_->ImportRows(table, part.slot(), ids, data));
          chunk_rows += static_cast<int64_t>(ids.size());
          chunk_bytes += static_cast<int64_t>(want);
        }
        *rows += chunk_rows;
        const int64_t pulled_bytes = pulled->fetch_add(chunk_bytes) + chunk_bytes;
        int64_t limit = 0;
        {
          absl::MutexLock lock(&moves_mu_);
          move->rows += chunk_rows;
          move->bytes += chunk_bytes;
          limit = move->max_bytes_per_second;
        }
        if (rate_limited && limit > 0) {
          // Paced by the bytes pulled in this round: the stream waits (flow
          // control holds the source's writes) while this thread sleeps, a
          // little at a time so that an abort or a shutdown is seen.
          const absl::Time due =
              start + absl::Seconds(static_cast<double>(pulled_bytes) / limit);
          for (absl::Time now = absl::Now(); now < due; now = absl::Now()) {
            {
              absl::MutexLock lock(&moves_mu_);
              if (move->abort_requested || moves_stop_) break;
            }
            absl::SleepFor(std::min(due - now, absl::Milliseconds(50)));
          }
        }
        return absl::OkStatus();
      });
}

absl::Status SlotMoves::RunCopy(const std::shared_ptr<Move>& move) {
  // Rows left from an earlier, failed copy of these units, or handed over
  // from here earlier and kept for a checkpoint: dropped now, not later.
  snapshots_->KeepUnits(move->units);
  const std::vector<int64_t> per_slot = store_->RowsPerSlot();
  for (const Unit& u : move->units) {
    if (per_slot[u.second] > 0) {
      if (absl::Status s = store_->DropSlot(u.first, u.second).status(); !s.ok()) {
        return s;
      }
    }
  }
  uint64_t since = 0;
  int64_t threshold = options_.move_catch_up_rows;
  int64_t previous = 0;
  for (int round = 0;; ++round) {
    uint64_t mark = 0;
    int64_t rows = 0;
    RETURN_IF_ERROR(PullRows(move, since, &mark, &rows, /*rate_limited=*/true));
    if (mark == 0) return absl::DataLossError("the source's export sent no mark");
    since = mark;
    if (round == 0) {
      threshold = std::max(threshold, rows / 100);
      previous = rows;
      continue;  // at least one catch-up round
    }
    // Small enough, or no longer shrinking (training changes the rows as
    // fast as they are copied: more rounds would not help), or enough.
    if (rows <= threshold || rows * 2 > previous ||
        round + 1 >= options_.move_max_rounds) {
      break;
    }
    previous = rows;
  }
  absl::MutexLock lock(&moves_mu_);
  move->last_mark = since;
  return absl::OkStatus();
}

void SlotMoves::FinishMove(const v1::FinishMoveRequest* request,
                             v1::FinishMoveResponse* response, Done done) {
  absl::MutexLock lock(&moves_mu_);
  const std::shared_ptr<Move> move = FindMove(request->move_id(), true);
  if (move == nullptr) {
    std::move(done)(absl::NotFoundError(absl::StrCat(
        "no move ", request->move_id(), " was copied to this server")));
    return;
  }
  if (move->phase == v1::MoveState::HANDED_OVER &&
      move->new_epoch == request->new_map().epoch()) {
    std::move(done)(absl::OkStatus());  // a retry
    return;
  }
  if (move->phase != v1::MoveState::COPIED || move->running || moves_stop_) {
    std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        "move ", move->id, " is ", PhaseName(move->phase),
        move->running ? " (busy)" : "", "; a hand-over needs it COPIED")));
    return;
  }
  if (request->source() != move->peer) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "move ", move->id, " copies from ", move->peer, ", not from ",
        request->source())));
    return;
  }
  move->running = true;
  StartMoveThread([this, move, request, response, done = std::move(done)]() mutable {
    absl::Status s = RunFinish(move, *request, response);
    std::vector<std::pair<v1::AbortMoveResponse*, Done>> aborts;
    {
      absl::MutexLock lock(&moves_mu_);
      move->running = false;
      if (!s.ok()) {
        move->error = std::string(s.message());
        if (move->abort_requested) {
          const int64_t dropped = DropUnits(*store_, move->units);
          move->phase = v1::MoveState::ABORTED;
          for (auto& a : move->abort_waiters) a.first->set_rows(dropped);
        }
      }
      aborts.swap(move->abort_waiters);
    }
    LogInfo("move ", move->id, ": hand-over from ", move->peer, " ",
            s.ok() ? "done" : absl::StrCat("failed: ", s.message()));
    std::move(done)(s);
    for (auto& [r, d] : aborts) std::move(d)(absl::OkStatus());
  });
}

absl::Status SlotMoves::RunFinish(const std::shared_ptr<Move>& move,
                                    const v1::FinishMoveRequest& request,
                                    v1::FinishMoveResponse* response) {
  const MapView view = CurrentMap();
  ASSIGN_OR_RETURN(ShardMap next, slot_migration::ParseNewMap(request.new_map(), options_.num_slots,
                                                              view->map.epoch()));
  if (request.add_backup() != move->as_backup) {
    return absl::InvalidArgumentError(absl::StrCat(
        "move ", move->id, " copied ", move->as_backup ? "a new backup's" : "a new owner's",
        " rows; the hand-over ", request.add_backup() ? "adds a backup" : "moves ownership"));
  }
  ASSIGN_OR_RETURN(std::vector<Unit> units,
                   move->as_backup
                       ? BackupDiff(view->map, next, move->peer, view->self_address)
                       : MoveDiff(view->map, next, move->peer, view->self_address));
  std::sort(units.begin(), units.end());
  if (units != move->units) {
    return absl::InvalidArgumentError(absl::StrCat(
        "new_map ", move->as_backup ? "adds a backup of " : "moves ", units.size(),
        " unit(s) from ", move->peer, " here, move ", move->id, " copied ",
        move->units.size(), " other ones"));
  }
  uint64_t since = 0;
  {
    absl::MutexLock lock(&moves_mu_);
    since = move->last_mark;
  }
  uint64_t mark = 0;
  int64_t delta = 0;
  RETURN_IF_ERROR(PullRows(move, since, &mark, &delta, /*rate_limited=*/false));
  response->set_delta_rows(delta);
  absl::MutexLock lock(&moves_mu_);
  if (move->abort_requested) {
    return absl::AbortedError(absl::StrCat("move ", move->id, " was aborted"));
  }
  if (moves_stop_) return absl::UnavailableError("shard server is shutting down");
  // A server that owned nothing took part in no step: it joins at the
  // source's step L before anyone routes to it (new_map is not installed
  // anywhere yet), so lookups of L + 1 run here. An owner already counts
  // every step (its clock may still wait for pushes of L: not touched).
  if (move->as_backup) {
    // The source's pushes of the units after its step L come here as
    // forwards on this server's clock of the source, which joins at L
    // unless it exists (backing other units, it takes every push already).
    RETURN_IF_ERROR(replication_->JoinAsBackup(
        move->peer, request.has_source_step() ? request.source_step() : -1));
    LogInfo("move ", move->id, ": this server backs ", move->units.size(), " unit(s) of ",
            move->peer, request.has_source_step()
                            ? absl::StrCat(" from the step after ", request.source_step())
                            : std::string());
  } else if (request.has_source_step()) {
    const MapView now = CurrentMap();
    if (!now->map.OwnsAnything(now->self)) {
      RETURN_IF_ERROR(clock_->AdoptStep(request.source_step()));
      LogInfo("move ", move->id, ": this server owned nothing; its step clock "
              "joins at the source's step ", request.source_step());
    }
  }
  v1::SetShardMapRequest set;
  *set.mutable_shard_map() = request.new_map();
  set.set_self(view->self_address);
  RETURN_IF_ERROR(map_->Install(set, nullptr));
  move->phase = v1::MoveState::HANDED_OVER;
  move->new_epoch = next.epoch();
  move->last_mark = mark;
  return absl::OkStatus();
}

void SlotMoves::AbortMove(const v1::AbortMoveRequest* request,
                            v1::AbortMoveResponse* response, Done done) {
  absl::MutexLock lock(&moves_mu_);
  const std::shared_ptr<Move> move = FindMove(request->move_id(), true);
  if (move == nullptr) {
    std::move(done)(
        FindMove(request->move_id(), false) != nullptr
            ? absl::FailedPreconditionError(absl::StrCat(
                  "this server is the source of move ", request->move_id(),
                  "; abort it on its target"))
            : absl::NotFoundError(absl::StrCat(
                  "no move ", request->move_id(), " on this server")));
    return;
  }
  switch (move->phase) {
    case v1::MoveState::HANDED_OVER:
      std::move(done)(absl::FailedPreconditionError(absl::StrCat(
          "move ", move->id, " was handed over (this server owns its units "
          "at shard map epoch ", move->new_epoch, "); move them back instead")));
      return;
    case v1::MoveState::ABORTED:
      std::move(done)(absl::OkStatus());
      return;
    default:
      break;
  }
  move->abort_requested = true;
  if (move->running) {
    // The copy or finish thread stops at its next chunk, drops the rows and
    // answers.
    move->abort_waiters.emplace_back(response, std::move(done));
    if (move->link != nullptr) move->link->Shutdown();
    return;
  }
  response->set_rows(DropUnits(*store_, move->units));
  move->phase = v1::MoveState::ABORTED;
  LogInfo("move ", move->id, ": aborted, ", response->rows(), " rows dropped");
  std::move(done)(absl::OkStatus());
}

absl::Status SlotMoves::ListMoves(const v1::ListMovesRequest&,
                                    v1::ListMovesResponse* response) const {
  absl::MutexLock lock(&moves_mu_);
  for (const auto& m : moves_) {
    v1::MoveState* s = response->add_moves();
    s->set_move_id(m->id);
    s->set_phase(m->phase);
    s->set_role(m->target ? "target" : "source");
    s->set_as_backup(m->as_backup);
    s->set_peer(m->peer);
    s->set_rows(m->rows);
    s->set_bytes(m->bytes);
    s->set_error(m->error);
  }
  return absl::OkStatus();
}

namespace slot_migration {

absl::StatusOr<ShardMap> ParseNewMap(const v1::ShardMap& proto, uint32_t num_slots,
                                     uint64_t current_epoch) {
  ASSIGN_OR_RETURN(ShardMap next, ShardMap::FromProto(proto));
  if (next.num_slots() != num_slots) {
    return absl::InvalidArgumentError(absl::StrCat("new_map has ", next.num_slots(),
                                                   " slots; this cluster has ", num_slots));
  }
  if (next.epoch() <= current_epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "new_map epoch ", next.epoch(), " is not newer than this server's ", current_epoch));
  }
  if (next.epoch() > current_epoch + kMaxShardMapEpochStep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "new_map epoch ", next.epoch(), " jumps more than ", kMaxShardMapEpochStep,
        " past this server's ", current_epoch, "; epochs grow by one per map change"));
  }
  return next;
}

}  // namespace slot_migration
}  // namespace recps::server

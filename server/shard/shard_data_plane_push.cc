// ShardServer's push path (shard_server.h): decode and check a gradient
// push, hold it for its step or hand it to the step clock, and apply a
// step's pushes when the clock says so. The rest of the class is in
// shard_server.cc.
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/wire/wire_format.h"
#include "server/shard/shard_metrics.h"
#include "server/shard/shard_data_plane.h"

namespace recps::server {
namespace {

// Reads 16-bit floats (fp16 or bf16) from unaligned bytes as floats: lets a
// vector be filled by assign() in one pass, with no zero-fill first.
class WideningIterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = float;
  using difference_type = std::ptrdiff_t;
  using pointer = const float*;
  using reference = float;

  WideningIterator(const char* p, bool fp16) : p_(p), fp16_(fp16) {}
  float operator*() const {
    uint16_t h;
    std::memcpy(&h, p_, 2);
    return fp16_ ? HalfToFloat(h) : Bf16ToFloat(h);
  }
  WideningIterator& operator++() {
    p_ += 2;
    return *this;
  }
  WideningIterator operator++(int) {
    WideningIterator old = *this;
    p_ += 2;
    return old;
  }
  bool operator==(const WideningIterator& o) const { return p_ == o.p_; }
  bool operator!=(const WideningIterator& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  bool fp16_;
};

// Gives `tg` the `n` gradient values in `bytes` (their size already
// checked against n and the encoding's width). fp32 values are borrowed in
// place (TableGradients::borrowed; `bytes` outlives the push's apply or the
// step clock copies them); others are widened in one pass, where resize()
// and a decode into it were two (the zero-fill was 6% of a 64k-id push's
// server CPU).
void DecodeGradients(const std::string& bytes, v1::RowEncoding encoding, size_t n,
                     TableGradients* tg) {
  std::vector<float>* const out = &tg->grads;
  const char* src = bytes.data();
  if (BytesPerElement(encoding) == 4) {
    if (reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
      tg->borrowed = reinterpret_cast<const float*>(src);
    } else {
      out->resize(n);
      if (n > 0) std::memcpy(out->data(), src, n * sizeof(float));
    }
    return;
  }
  if (encoding == v1::ROW_ENCODING_FLOAT16) {
    // The bulk (F16C) widening beats saving the zero-fill.
    out->resize(n);
    WidenRows(src, n, encoding, out->data());
    return;
  }
  out->assign(WideningIterator(src, false), WideningIterator(src + 2 * n, false));
}

bool IsEmptyPush(const GradientPush& push) {
  for (const TableGradients& tg : push) {
    if (!tg.ids.empty()) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<GradientPush> ShardDataPlane::DecodePush(
    const MapView& view, const v1::PushGradientsRequest& request,
    absl::Span<const float* const> direct, bool* owns_nothing, int primary) {
  RETURN_IF_ERROR(CheckHeader(request.header(), view, /*forwarded=*/primary >= 0));
  if (!direct.empty() && direct.size() != static_cast<size_t>(request.tables_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push of ", request.tables_size(), " tables with ", direct.size(),
        " in-place gradient entries"));
  }
  *owns_nothing = !view->map.OwnsAnything(view->self);
  GradientPush push;
  absl::flat_hash_set<int> seen_tables;
  int64_t total_ids = 0;
  std::vector<int64_t> scratch;
  for (const v1::TableGradients& t : request.tables()) {
    ASSIGN_OR_RETURN(const int table, store_->FindTable(t.table()));
    if (!seen_tables.insert(table).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", t.table(), " appears twice in one push"));
    }
    const config::TableSpec& spec = store_->spec(table);
    absl::Span<const int64_t> ids;
    RETURN_IF_ERROR(DecodeIds(t.ids(), t.table().c_str(), &scratch, &ids));
    total_ids += ids.size();
    if (total_ids > options_.max_ids_per_request) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "push carries more than max_ids_per_request=",
          options_.max_ids_per_request, " ids; split the batch"));
    }
    if (primary >= 0) {
      RETURN_IF_ERROR(
          CheckBacked(view, spec, ids, primary, request.header().shard_map_epoch()));
    } else {
      RETURN_IF_ERROR(CheckOwned(view, spec, ids));
      CountLoad(view, spec, ids, SlotLoad::Kind::kUpdate);
    }
    // The gradient bytes must match before anything is sized from the ids:
    // a request of ids without gradients must not allocate ids x dim floats.
    const size_t width = BytesPerElement(t.encoding());
    if (width == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tables[", push.size(), "] (table ", spec.name,
          "): unknown gradient encoding ", static_cast<int>(t.encoding())));
    }
    const size_t values = ids.size() * static_cast<size_t>(spec.dim);
    const float* const in_place = direct.empty() ? nullptr : direct[push.size()];
    if (in_place != nullptr &&
        (!t.grads().empty() || BytesPerElement(t.encoding()) != sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tables[", push.size(), "] (table ", spec.name, "): gradients both in "
          "place and in the request, or in place and not fp32"));
    }
    if (in_place == nullptr && t.grads().size() != values * width) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tables[", push.size(), "].grads (table ", spec.name, "): expected ",
          values, " values (", ids.size(), " ids x dim ", spec.dim, ") of ",
          width, " bytes = ", values * width, " bytes, got ", t.grads().size(),
          " bytes"));
    }
    TableGradients tg;
    tg.table = table;
    tg.dim = spec.dim;
    tg.ids.assign(ids.begin(), ids.end());
    if (in_place != nullptr) {
      tg.borrowed = in_place;  // the in-process caller's rows (PushGradientsFrom)
    } else {
      DecodeGradients(t.grads(), t.encoding(), values, &tg);
    }
    RETURN_IF_ERROR(store_->ValidateGradients(table, tg.ids, tg.data()));
    push.push_back(std::move(tg));
  }
  return push;
}

absl::Status ShardDataPlane::ApplyPush(GradientPush& push) {
  if (options_.consistency.mode == ConsistencyMode::kSync) {
    // The ids this step updates, for updated_only lookups of the next step
    // (8 bytes per id; the set is built only when asked).
    absl::MutexLock lock(&updates_mu_);
    for (auto& [table, updates] : last_step_updates_) updates.Clear();
    for (const TableGradients& tg : push) {
      StepUpdates& u = last_step_updates_[tg.table];
      u.ids.insert(u.ids.end(), tg.ids.begin(), tg.ids.end());
    }
  }
  for (TableGradients& tg : push) {
    RETURN_IF_ERROR(store_->ApplyGradients(tg.table, tg.ids, tg.data()));
    if (metrics_ != nullptr) metrics_->AddUpdatedIds(tg.ids.size());
  }
  return absl::OkStatus();
}

void ShardDataPlane::PushGradients(const v1::PushGradientsRequest* request,
                                v1::PushGradientsResponse* response, Done done,
                                absl::Span<const float* const> grads) {
  push_requests_.fetch_add(1, std::memory_order_relaxed);
  // On a work thread: in sync mode the push that completes a step applies
  // the whole step (every worker's gradients summed), tens of milliseconds
  // for large steps, too long to hold a gRPC thread. (Running pushes inline
  // as lookups do saved no CPU.)
  work_->Schedule([this, request, grads, response, done = std::move(done)]() mutable {
    RunPush(request, grads, response, std::move(done));
  });
}

void ShardDataPlane::RunPush(const v1::PushGradientsRequest* request,
                          absl::Span<const float* const> direct,
                          v1::PushGradientsResponse* response, Done done) {
  bool owns_nothing = false;
  const MapView view = CurrentMap();
  absl::StatusOr<GradientPush> push = DecodePush(view, *request, direct, &owns_nothing);
  absl::Status s = push.status();
  // A server that owns nothing (started while the job trains and not given
  // a share yet, or drained) takes part in no step: an empty push routed by
  // a map that still sends it one is accepted and dropped. Its clock joins
  // at the source's step when a move gives it slots (FinishMove).
  if (s.ok() && owns_nothing && IsEmptyPush(*push)) {
    response->set_applied_step(applied_step());
    response->set_incarnation(incarnation_);
    std::move(done)(absl::OkStatus());
    return;
  }
  // Replication: the backups of the push's ids take it while this server
  // applies it; it is acknowledged once all did (a retry forwards again,
  // and every replica drops a part it already took).
  if (s.ok()) s = Fence(*view);
  std::shared_ptr<ForwardJoin> forwards;
  if (s.ok()) forwards = replication_->Forward(view, request->header(), *push);
  if (s.ok()) {
    // Async pushes apply here: a hand-over waits for those in flight by
    // taking the gate as a writer once its hold is in place.
    std::optional<absl::Status> applied;
    if (options_.consistency.mode == ConsistencyMode::kAsync) {
      absl::ReaderMutexLock gate(&holds_->push_gate());
      // The first push since the clock (re)started (fresh, ResumeAt, a
      // rollback): every worker counts as caught up with its start.
      if (!clock_->any_push()) worker_steps_.Reset(clock_->applied_step());
      applied = HoldOrApply(request, direct, response, *std::move(push), done);
      if (applied.has_value() && applied->ok()) {
        worker_steps_.Applied(request->header().worker_rank(), request->header().step());
      }
    } else {
      applied = HoldOrApply(request, direct, response, *std::move(push), done);
    }
    if (!applied.has_value()) return;  // held: runs again when released
    s = *applied;
  }
  if (forwards == nullptr) {
    response->set_applied_step(applied_step());
    response->set_incarnation(incarnation_);
    std::move(done)(s);
    return;
  }
  forwards->Then([this, s, response, applied_at = absl::Now(),
                  done = std::move(done)](absl::Status forwarded) mutable {
    if (metrics_ != nullptr) {
      metrics_->RecordForwardWait(absl::ToDoubleSeconds(absl::Now() - applied_at));
    }
    response->set_applied_step(applied_step());
    response->set_incarnation(incarnation_);
    std::move(done)(s.ok() ? forwarded : s);
  });
}

void ShardDataPlane::ReplicatePush(const v1::ReplicatePushRequest* request,
                                   v1::PushGradientsResponse* response, Done done) {
  replica_work_.Schedule([this, request, response, done = std::move(done)]() mutable {
    RunReplicaPush(request, response, std::move(done));
  });
}

void ShardDataPlane::RunReplicaPush(const v1::ReplicatePushRequest* request,
                                    v1::PushGradientsResponse* response, Done done) {
  const MapView view = CurrentMap();
  const int primary = view->map.IndexOf(request->primary());
  absl::Status s;
  if (primary < 0 || primary == view->self) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "a push forwarded by ", request->primary(), ", which is not another server of shard "
        "map epoch ", view->map.epoch()));
  } else {
    bool owns_nothing = false;
    absl::StatusOr<GradientPush> push =
        DecodePush(view, request->push(), {}, &owns_nothing, primary);
    s = push.ok() ? replication_->ApplyForwarded(request->primary(), request->push().header(),
                                                 *std::move(push))
                  : push.status();
    if (s.ok() && metrics_ != nullptr) metrics_->AddReplicaPush();
  }
  response->set_incarnation(incarnation_);
  std::move(done)(s);
}

void ShardDataPlane::StopReplication() { replication_->Shutdown(); }

void ShardDataPlane::OnMapInstalled() { replication_->OnMapInstalled(CurrentMap(), *clock_); }

absl::Status ShardDataPlane::Fence(const ShardRouting& view) {
  if (view.map.replication() <= 1) return absl::OkStatus();
  const int64_t until = lease_until_ns_.load(std::memory_order_relaxed);
  if (absl::ToUnixNanos(absl::Now()) <= until) return absl::OkStatus();
  if (!fenced_.exchange(true)) {
    LogWarning("the coordinator lease lapsed at ", absl::FormatTime(absl::FromUnixNanos(until)),
               ": this shard server takes no lookups or pushes until it is renewed (the "
               "coordinator may fail it over to its backups)");
  }
  return absl::UnavailableError(absl::StrCat(
      "shard server ", view.self_address, ": its coordinator lease lapsed at ",
      absl::FormatTime(absl::FromUnixNanos(until)), "; it takes no lookups or pushes until "
      "the lease is renewed (its backups may own its rows now: refresh the shard map)"));
}

void ShardDataPlane::SetLeaseHeldUntil(absl::Time until) {
  lease_until_ns_.store(absl::ToUnixNanos(until), std::memory_order_relaxed);
  if (until > absl::Now() && fenced_.exchange(false)) {
    LogInfo("the coordinator lease is renewed: this shard server takes lookups and pushes again");
  }
}

absl::Status ShardDataPlane::PushToClocks(const v1::RequestHeader& header, GradientPush push) {
  const int rank = header.worker_rank();
  const int64_t step = header.step();
  absl::Status status;
  {
    absl::ReaderMutexLock hold(&replication_->push_mu());
    // Checked against the map when the request came (CheckHeader), a push
    // of an older map may meet the lineage of a newer one installed since:
    // split by it, the part of a unit taken over in between would be empty,
    // and mark the worker arrived on that unit's clock under its part id
    // (its real part, sent again by the new map, then dropped as a retry).
    // Stale, as CheckHeader would say now: the worker takes the new map.
    // A newer one is not ready yet (LineageReadyFor). One read of the
    // epoch for both: this is every push's path.
    const uint64_t now = replication_->lineage_epoch();
    if (header.shard_map_epoch() > now) {
      return replication_->LineageReadyFor(header.shard_map_epoch());
    }
    if (header.shard_map_epoch() < now) {
      return StaleEpochError(
          absl::StrCat("stale shard map: push routed with epoch ", header.shard_map_epoch(),
                       ", this server installed epoch ", now,
                       " while taking it; refresh the map and retry"),
          now);
    }
    std::vector<Replication::ClockPart> parts =
        replication_->SplitByLineage(clock_.get(), std::move(push));
    for (size_t k = 0; k < parts.size(); ++k) {
      StepClock* clock = parts[k].clock;
      // A server promoted to units it only backed before steps no unit on
      // its own clock, which never took part in a step: nothing to take.
      if (k == 0 && IsEmptyPush(parts[k].push) && replication_->OwnClockIdle()) continue;
      // A worker re-sends an empty push to every server after a failover's
      // map (so that each lineage clock sees it arrive): a clock that has
      // the rank's push of the step already takes nothing from it.
      if (IsEmptyPush(parts[k].push) && clock->Arrived(rank, step)) continue;
      absl::Status s = clock->Push(rank, step, std::move(parts[k].push), header.push_part());
      if (status.ok()) status = std::move(s);
    }
  }
  // After a failover: the units taken over join the own clock once it and
  // their lost primary's are at one step.
  replication_->MergeSettledLineages(clock_.get());
  return status;
}

std::optional<absl::Status> ShardDataPlane::HoldOrApply(
    const v1::PushGradientsRequest* request, absl::Span<const float* const> direct,
    v1::PushGradientsResponse* response, GradientPush push, Done& done) {
  const v1::RequestHeader& header = request->header();
  // Sync, bounded: a hand-over to a server that owns nothing yet holds every
  // push of a step after the newest step seen (its L); see RunHandOver.
  if (options_.consistency.mode != ConsistencyMode::kAsync) {
    holds_->NoteRequestStep(header.step());
  }
  if (holds_->any() &&
      holds_->ParkIfHeld(header, nullptr, &push, [&]() -> absl::AnyInvocable<void() &&> {
        return [this, request, direct, response, done = std::move(done)]() mutable {
          RunPush(request, direct, response, std::move(done));
        };
      })) {
    return std::nullopt;
  }
  return PushToClocks(header, std::move(push));
}

}  // namespace recps::server

#include "server/shard/step_clock.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace recps::server {

const char* ConsistencyModeName(ConsistencyMode mode) {
  switch (mode) {
    case ConsistencyMode::kSync:
      return "sync";
    case ConsistencyMode::kBounded:
      return "bounded";
    case ConsistencyMode::kAsync:
      return "async";
  }
  return "unknown";
}

StepClock::StepClock(const ConsistencyOptions& options, ApplyFn apply)
    : options_(options), apply_(std::move(apply)) {
  parts_.resize(std::max(options_.world_size, 0));
  parts_next_.resize(parts_.size(), 0);
  timer_ = std::thread([this] { TimerLoop(); });
}

StepClock::~StepClock() {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    waiters.swap(waiters_);
    waiting_ids_ = 0;
  }
  for (Waiter& w : waiters) {
    std::move(w.done)(absl::UnavailableError("shard server is shutting down"));
  }
  timer_.join();
}

bool StepClock::LookupReady(int64_t step) const {
  switch (options_.mode) {
    case ConsistencyMode::kAsync:
      return true;
    case ConsistencyMode::kSync:
      return step <= applied_step_ + 1;
    case ConsistencyMode::kBounded:
      return step <= applied_step_ + 1 + options_.staleness;
  }
  return true;
}

bool StepClock::started() const {
  absl::MutexLock lock(&mu_);
  return any_push_ || applied_step_ >= 0;
}

bool StepClock::any_push() const {
  absl::MutexLock lock(&mu_);
  return any_push_;
}

bool StepClock::Arrived(int rank, int64_t step) const {
  absl::MutexLock lock(&mu_);
  if (step <= applied_step_) return true;
  const auto it = pending_.find(step);
  return it != pending_.end() && rank >= 0 &&
         static_cast<size_t>(rank) < it->second.by_rank.size() &&
         it->second.by_rank[rank].has_value();
}

int64_t StepClock::applied_step() const {
  absl::MutexLock lock(&mu_);
  return applied_step_;
}

int StepClock::waiting_lookups() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiters_.size());
}

int64_t StepClock::waiting_ids() const {
  absl::MutexLock lock(&mu_);
  return waiting_ids_;
}

StepClock::Waiter StepClock::TakeWaiter(size_t i) {
  Waiter w = std::move(waiters_[i]);
  waiters_[i] = std::move(waiters_.back());
  waiters_.pop_back();
  waiting_ids_ -= w.ids;
  return w;
}

bool StepClock::SeenPart(int rank, int64_t step, uint64_t part) const {
  for (const auto& [s, p] : parts_[rank]) {
    if (s == step && p == part) return true;
  }
  return false;
}

void StepClock::RememberPart(int rank, int64_t step, uint64_t part) {
  std::vector<std::pair<int64_t, uint64_t>>& ring = parts_[rank];
  if (ring.size() < kRememberedParts) {
    ring.emplace_back(step, part);
    return;
  }
  ring[parts_next_[rank]] = {step, part};
  parts_next_[rank] = (parts_next_[rank] + 1) % kRememberedParts;
}

namespace {

// INVALID_ARGUMENT when an id of `more` is also in `have` (same table).
absl::Status CheckDisjoint(const GradientPush& have, const GradientPush& more) {
  for (const TableGradients& m : more) {
    absl::flat_hash_set<int64_t> ids;
    for (const TableGradients& h : have) {
      if (h.table == m.table) ids.insert(h.ids.begin(), h.ids.end());
    }
    if (ids.empty()) continue;
    for (int64_t id : m.ids) {
      if (ids.contains(id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "id ", id, " of table index ", m.table, " is in two parts of one "
            "rank's push for one step; each id goes in one part"));
      }
    }
  }
  return absl::OkStatus();
}

// A replica clock's retry (ConsistencyOptions::replica): drops from `more`
// the ids `have` holds already, whose gradients must be the same bits.
absl::Status DropRetried(const GradientPush& have, GradientPush& more) {
  for (TableGradients& m : more) {
    absl::flat_hash_map<int64_t, const float*> rows;
    for (const TableGradients& h : have) {
      if (h.table != m.table) continue;
      for (size_t i = 0; i < h.ids.size(); ++i) {
        rows.emplace(h.ids[i], h.data() + i * static_cast<size_t>(h.dim));
      }
    }
    if (rows.empty()) continue;
    const size_t row_bytes = static_cast<size_t>(m.dim) * sizeof(float);
    TableGradients kept;
    kept.table = m.table;
    kept.dim = m.dim;
    for (size_t i = 0; i < m.ids.size(); ++i) {
      const float* row = m.data() + i * static_cast<size_t>(m.dim);
      const auto it = rows.find(m.ids[i]);
      if (it == rows.end()) {
        kept.ids.push_back(m.ids[i]);
        kept.grads.insert(kept.grads.end(), row, row + m.dim);
      } else if (std::memcmp(it->second, row, row_bytes) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "id ", m.ids[i], " of table index ", m.table, " came again in one rank's "
            "push for one step with another gradient: not a retry"));
      }
    }
    m = std::move(kept);
  }
  return absl::OkStatus();
}

bool IsEmpty(const GradientPush& push) {
  for (const TableGradients& tg : push) {
    if (!tg.ids.empty()) return false;
  }
  return true;
}

bool IsBorrowed(const GradientPush& push) {
  for (const TableGradients& tg : push) {
    if (tg.borrowed != nullptr) return true;
  }
  return false;
}

void Own(GradientPush& push, int room_for = 1) {
  for (TableGradients& tg : push) tg.Own(room_for);
}

}  // namespace

void TableGradients::Own(int room_for) {
  if (borrowed == nullptr) return;
  const size_t values = ids.size() * static_cast<size_t>(dim);
  grads.reserve(values * static_cast<size_t>(std::max(1, room_for)));
  grads.assign(borrowed, borrowed + values);
  borrowed = nullptr;
}

void StepClock::DropAppliedIds(int rank, int64_t step, GradientPush& push) {
  if (async_applied_.empty()) async_applied_.resize(std::max(options_.world_size, 0));
  AppliedIds& applied = async_applied_[rank];
  if (step < applied.step) return;  // not this rank's newest step: cannot tell
  if (step > applied.step) {
    applied.step = step;
    applied.keys.clear();
  }
  const auto key = [](int table, int64_t id) { return std::make_pair(table, id); };
  bool repeated = false;
  for (const TableGradients& tg : push) {
    for (int64_t id : tg.ids) repeated |= applied.keys.contains(key(tg.table, id));
  }
  if (repeated) {  // rare: a retry after a failover; keep the new ids only
    for (TableGradients& tg : push) {
      TableGradients kept;
      kept.table = tg.table;
      kept.dim = tg.dim;
      for (size_t i = 0; i < tg.ids.size(); ++i) {
        if (applied.keys.contains(key(tg.table, tg.ids[i]))) continue;
        const float* row = tg.data() + i * static_cast<size_t>(tg.dim);
        kept.ids.push_back(tg.ids[i]);
        kept.grads.insert(kept.grads.end(), row, row + tg.dim);
      }
      tg = std::move(kept);
    }
  }
  for (const TableGradients& tg : push) {
    for (int64_t id : tg.ids) applied.keys.insert(key(tg.table, id));
  }
}

bool StepClock::WouldApplyAtOnce(int rank, int64_t step) const {
  if (applying_ || step != applied_step_ + 1) return false;
  const auto it = pending_.find(step);
  if (it == pending_.end()) return options_.world_size == 1;
  return !it->second.by_rank[rank].has_value() &&
         it->second.arrived + 1 == options_.world_size;
}

std::optional<StepClock::TakenStep> StepClock::TakeCompleteStep() {
  if (applying_) return std::nullopt;  // that thread will continue
  auto it = pending_.find(applied_step_ + 1);
  if (it == pending_.end() || it->second.arrived < options_.world_size) {
    return std::nullopt;
  }
  applying_ = true;
  TakenStep taken{it->first, {}};
  taken.pushes.reserve(options_.world_size);
  for (auto& p : it->second.by_rank) taken.pushes.push_back(std::move(*p));
  pending_.erase(it);
  return taken;
}

absl::Status StepClock::Push(int rank, int64_t step, GradientPush push,
                             uint64_t part) {
  if (rank < 0 || rank >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker rank ", rank, " is outside the job's ranks [0, ",
        options_.world_size, ")"));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative step ", step));
  }
  {
    absl::MutexLock lock(&mu_);
    any_push_ = true;
  }
  // A borrowed push that will not complete the next step here is copied
  // now, outside the lock (the first ranks of a step with W > 1).
  if (options_.mode != ConsistencyMode::kAsync && IsBorrowed(push)) {
    bool at_once;
    {
      absl::MutexLock lock(&mu_);
      at_once = WouldApplyAtOnce(rank, step);
    }
    // Its rows are summed with the other ranks' (up to world_size times as
    // many rows; virtual until written).
    if (!at_once) Own(push, options_.world_size);
  }
  if (options_.mode == ConsistencyMode::kAsync) {
    if (part != 0 || options_.replica) {
      absl::MutexLock lock(&mu_);
      if (part != 0 && SeenPart(rank, step, part)) return absl::OkStatus();  // a retry
      if (part != 0) RememberPart(rank, step, part);
      if (options_.replica) DropAppliedIds(rank, step, push);
    }
    absl::Status s = apply_(push);
    absl::MutexLock lock(&mu_);
    if (step > applied_step_) applied_step_ = step;
    return s;
  }
  std::optional<TakenStep> taken;
  {
    absl::MutexLock lock(&mu_);
    if (!apply_error_.ok()) return apply_error_;
    if (part != 0 && SeenPart(rank, step, part)) return absl::OkStatus();
    if (step <= adopted_step_ && step <= applied_step_ && IsEmpty(push)) {
      return absl::OkStatus();  // routed by a map without this server's share
    }
    if (step <= applied_step_ && options_.replica) {
      return absl::OkStatus();  // a retry of a forwarded push
    }
    if (step <= applied_step_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, " was already applied (this server has applied "
          "steps up to ", applied_step_, "); pushes cannot go to the past",
          part != 0 ? absl::StrCat(" (push part ", part, " of worker rank ",
                                   rank, " arrived too late)")
                    : ""));
    }
    const int64_t window =
        (options_.mode == ConsistencyMode::kBounded ? options_.staleness : 0) +
        options_.forward_window;
    if (step > applied_step_ + 1 + window) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, " is ahead of the ", ConsistencyModeName(options_.mode),
          " window: this server has applied up to step ", applied_step_,
          " and accepts steps up to ", applied_step_ + 1 + window));
    }
    PendingStep& pending = pending_[step];
    if (pending.by_rank.empty()) pending.by_rank.resize(options_.world_size);
    if (pending.by_rank[rank].has_value()) {
      if (part == 0) return absl::OkStatus();  // a retry without identity
      // A second part of the rank's push (ids re-routed after a map change):
      // merged, so the step's sum stays one gradient per rank and id.
      GradientPush& have = *pending.by_rank[rank];
      if (options_.replica) RETURN_IF_ERROR(DropRetried(have, push));
      RETURN_IF_ERROR(CheckDisjoint(have, push));
      Own(push);  // kept past this call (rare: a re-routed part)
      for (TableGradients& tg : push) have.push_back(std::move(tg));
      RememberPart(rank, step, part);
      return absl::OkStatus();
    }
    std::optional<GradientPush>& stored = pending.by_rank[rank];
    stored = std::move(push);
    ++pending.arrived;
    if (part != 0) RememberPart(rank, step, part);
    // Taken in this critical section: a step holding borrowed rows is
    // applied by this thread, before the request they point into can go.
    const bool borrowed = IsBorrowed(*stored);
    taken = TakeCompleteStep();  // erases `stored`'s entry if it takes step
    if (borrowed && (!taken.has_value() || taken->step != step)) {
      Own(*stored);  // the clock moved since WouldApplyAtOnce: rare
    }
  }
  return DrainCompleteSteps(std::move(taken));
}

absl::Status StepClock::DrainCompleteSteps(std::optional<TakenStep> taken) {
  for (;;) {
    if (!taken.has_value()) {
      absl::MutexLock lock(&mu_);
      taken = TakeCompleteStep();
      if (!taken.has_value()) return absl::OkStatus();
    }
    const int64_t step = taken->step;
    GradientPush summed = SumInRankOrder(taken->pushes);
    absl::Status status = apply_(summed);
    taken.reset();
    std::vector<Waiter> ready;
    {
      absl::MutexLock lock(&mu_);
      applying_ = false;
      // AdoptStep may have moved the clock past it meanwhile.
      applied_step_ = std::max(applied_step_, step);
      if (!status.ok() && apply_error_.ok()) {
        apply_error_ = absl::Status(
            status.code(),
            absl::StrCat("applying step ", step, " failed: ", status.message()));
      }
      for (size_t i = 0; i < waiters_.size();) {
        if (!apply_error_.ok() || LookupReady(waiters_[i].step)) {
          ready.push_back(TakeWaiter(i));
        } else {
          ++i;
        }
      }
    }
    const absl::Status for_waiters = status.ok() ? absl::OkStatus() : status;
    for (Waiter& w : ready) std::move(w.done)(for_waiters);
    if (!status.ok()) return status;
  }
}

void StepClock::AwaitLookup(int64_t step,
                            absl::AnyInvocable<void(absl::Status) &&> done,
                            int64_t ids, std::function<bool()> cancelled) {
  if (step < 0) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat("negative step ", step)));
    return;
  }
  absl::Status result;
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (StepClock* to = merged_into_.load(std::memory_order_relaxed)) {
      lock.Release();
      to->AwaitLookup(step, std::move(done), ids, std::move(cancelled));
      return;
    }
    if (!apply_error_.ok()) {
      result = apply_error_;
    } else if (LookupReady(step)) {
      result = absl::OkStatus();
    } else if (stopping_) {
      result = absl::UnavailableError("shard server is shutting down");
    } else if (cancelled != nullptr && cancelled()) {
      result = absl::CancelledError("the client cancelled the lookup");
    } else if (static_cast<int64_t>(waiters_.size()) >= options_.max_parked_lookups) {
      result = absl::ResourceExhaustedError(absl::StrCat(
          "lookup for step ", step, " would wait, but ", waiters_.size(),
          " lookups are already waiting, the limit (--max_parked_lookups=",
          options_.max_parked_lookups, "); ", Missing(applied_step_ + 1)));
    } else if (waiting_ids_ + ids > options_.max_parked_ids) {
      result = absl::ResourceExhaustedError(absl::StrCat(
          "lookup of ", ids, " ids for step ", step, " would wait, but ",
          waiting_ids_, " ids are already waiting and the limit is "
          "--max_parked_ids=", options_.max_parked_ids, "; ",
          Missing(applied_step_ + 1)));
    } else {
      waiting_ids_ += ids;
      waiters_.push_back(Waiter{step, absl::Now() + options_.step_timeout,
                                std::move(done), ids, std::move(cancelled)});
      return;
    }
  }
  std::move(done)(result);
}

absl::Status StepClock::RunAtCut(int64_t step, absl::Duration timeout,
                                 absl::FunctionRef<absl::Status()> fn) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative step ", step));
  }
  absl::ReleasableMutexLock lock(&mu_);
  if (StepClock* to = merged_into_.load(std::memory_order_relaxed)) {
    lock.Release();
    return to->RunAtCut(step, timeout, fn);
  }
  auto ready = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !apply_error_.ok() ||
           (!applying_ && applied_step_ >= step - 1);
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (stopping_) return absl::UnavailableError("shard server is shutting down");
  if (!apply_error_.ok()) return apply_error_;
  if (applied_step_ >= step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint at step ", step, " is too late: this server has applied "
        "steps up to ", applied_step_, " (", applied_step_ + 1,
        " steps completed); a cut must be taken before step ", step,
        " is applied"));
  }
  if (applying_ || applied_step_ < step - 1) {
    return absl::DeadlineExceededError(absl::StrCat(
        "checkpoint at step ", step, " waited ", absl::FormatDuration(timeout),
        " for step ", step - 1, " to be applied: ",
        Missing(applied_step_ + 1)));
  }
  return fn();
}

absl::Status StepClock::WaitApplied(int64_t step, absl::Duration timeout) {
  if (step < 0) return absl::OkStatus();
  absl::ReleasableMutexLock lock(&mu_);
  if (StepClock* to = merged_into_.load(std::memory_order_relaxed)) {
    lock.Release();
    return to->WaitApplied(step, timeout);
  }
  auto ready = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !apply_error_.ok() ||
           (!applying_ && applied_step_ >= step);
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (stopping_) return absl::UnavailableError("shard server is shutting down");
  if (!apply_error_.ok()) return apply_error_;
  if (applying_ || applied_step_ < step) {
    return absl::DeadlineExceededError(absl::StrCat(
        "waited ", absl::FormatDuration(timeout), " for step ", step,
        " to be applied: ", Missing(applied_step_ + 1)));
  }
  return absl::OkStatus();
}

absl::Status StepClock::ResumeAt(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative step ", step));
  }
  std::vector<Waiter> ready;
  {
    absl::MutexLock lock(&mu_);
    if (any_push_ || applied_step_ >= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot restart the step clock at step ", step,
          ": pushes already arrived (applied up to step ", applied_step_,
          "); restore before training starts"));
    }
    applied_step_ = step - 1;
    for (size_t i = 0; i < waiters_.size();) {
      if (LookupReady(waiters_[i].step)) {
        ready.push_back(TakeWaiter(i));
      } else {
        ++i;
      }
    }
  }
  for (Waiter& w : ready) std::move(w.done)(absl::OkStatus());
  return absl::OkStatus();
}

absl::Status StepClock::Restart(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative step ", step));
  }
  std::vector<Waiter> aborted;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](StepClock* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
          return !c->applying_ || c->stopping_;
        },
        this));
    if (stopping_) return absl::UnavailableError("shard server is shutting down");
    pending_.clear();
    for (auto& ring : parts_) ring.clear();
    async_applied_.clear();
    std::fill(parts_next_.begin(), parts_next_.end(), 0);
    apply_error_ = absl::OkStatus();
    adopted_step_ = -1;
    any_push_ = false;
    applied_step_ = step - 1;
    aborted.swap(waiters_);
    waiting_ids_ = 0;
  }
  for (Waiter& w : aborted) {
    std::move(w.done)(absl::AbortedError(absl::StrCat(
        "the job rolled back to step ", step, "; this lookup was of its earlier run")));
  }
  return absl::OkStatus();
}

absl::Status StepClock::AdoptStep(int64_t step) {
  if (step < -1) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, " < -1"));
  }
  std::vector<Waiter> ready;
  {
    absl::MutexLock lock(&mu_);
    if (step <= applied_step_) return absl::OkStatus();
    // Pushes kept from before were of steps nobody waits for any more.
    pending_.clear();
    applied_step_ = step;
    adopted_step_ = step;
    for (size_t i = 0; i < waiters_.size();) {
      if (LookupReady(waiters_[i].step)) {
        ready.push_back(TakeWaiter(i));
      } else {
        ++i;
      }
    }
  }
  for (Waiter& w : ready) std::move(w.done)(absl::OkStatus());
  return absl::OkStatus();
}

bool StepClock::BetweenSteps() const {
  absl::MutexLock lock(&mu_);
  return BetweenStepsLocked();
}

bool StepClock::BetweenStepsLocked() const {
  return pending_.empty() && !applying_ && apply_error_.ok();
}

int64_t StepClock::newest_step() const {
  absl::MutexLock lock(&mu_);
  return pending_.empty() ? applied_step_ : std::max(applied_step_, pending_.rbegin()->first);
}

absl::Status StepClock::MergeInto(StepClock* into) {
  if (into == this) return absl::InvalidArgumentError("a clock cannot merge into itself");
  std::vector<Waiter> moved;
  {
    absl::MutexLock into_lock(&into->mu_);
    absl::MutexLock lock(&mu_);
    if (merged_into_.load(std::memory_order_relaxed) != nullptr ||
        !BetweenStepsLocked() || !into->BetweenStepsLocked() ||
        applied_step_ != into->applied_step_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a clock merges only into another between steps at its step (applied ",
          applied_step_, " here, ", into->applied_step_, " there)"));
    }
    for (size_t r = 0; r < parts_.size() && r < into->parts_.size(); ++r) {
      for (const auto& [step, part] : parts_[r]) {
        if (!into->SeenPart(static_cast<int>(r), step, part)) {
          into->RememberPart(static_cast<int>(r), step, part);
        }
      }
    }
    into->any_push_ = into->any_push_ || any_push_;
    moved.swap(waiters_);
    waiting_ids_ = 0;
    merged_into_.store(into, std::memory_order_release);
  }
  // Parked again where the steps they wait for are applied now (a fresh
  // step_timeout: they waited for nothing that was late).
  for (Waiter& w : moved) {
    into->AwaitLookup(w.step, std::move(w.done), w.ids, std::move(w.cancelled));
  }
  return absl::OkStatus();
}

std::string StepClock::Missing(int64_t step) const {
  std::vector<int> missing;
  int arrived = 0;
  auto it = pending_.find(step);
  for (int r = 0; r < options_.world_size; ++r) {
    if (it != pending_.end() && it->second.by_rank[r].has_value()) {
      ++arrived;
    } else {
      missing.push_back(r);
    }
  }
  return absl::StrCat("step ", step, " is missing pushes from worker rank(s) ",
                      absl::StrJoin(missing, ", "), " (", arrived, " of ",
                      options_.world_size, " arrived)");
}

void StepClock::TimerLoop() {
  for (;;) {
    std::vector<std::pair<Waiter, std::string>> expired;
    std::vector<Waiter> cancelled;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50));
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (size_t i = 0; i < waiters_.size();) {
        if (waiters_[i].cancelled != nullptr && waiters_[i].cancelled()) {
          cancelled.push_back(TakeWaiter(i));
        } else if (waiters_[i].deadline <= now) {
          std::string why = absl::StrCat(
              "lookup for step ", waiters_[i].step, " waited ",
              absl::FormatDuration(options_.step_timeout), " (",
              ConsistencyModeName(options_.mode), " mode): ",
              Missing(applied_step_ + 1));
          expired.emplace_back(TakeWaiter(i), std::move(why));
        } else {
          ++i;
        }
      }
    }
    // Outside the lock: done frees the request (and may finish the call).
    for (Waiter& w : cancelled) {
      std::move(w.done)(absl::CancelledError("the client cancelled the lookup"));
    }
    for (auto& [w, why] : expired) {
      std::move(w.done)(absl::DeadlineExceededError(why));
    }
  }
}

namespace {

// Where each id of a table's sum sits: a flat array over the ids' range
// when the ids are dense in it (a fixed table's ids lie in [0, num_rows):
// one load per id), else a hash map. Either way the same positions, so the
// same sum.
class IdPositions {
 public:
  IdPositions(int64_t min_id, int64_t max_id, size_t total_ids) {
    // max - min, without overflow (ids may be any int64).
    const uint64_t span = static_cast<uint64_t>(max_id) - static_cast<uint64_t>(min_id);
    // Dense enough that zeroing the array costs less than hashing the ids.
    if (min_id <= max_id && span < kFlatMaxRange &&
        span < std::max<uint64_t>(uint64_t{1} << 16, 8 * uint64_t{total_ids})) {
      base_ = min_id;
      flat_.assign(span + 1, 0);
    } else {
      map_.reserve(total_ids);
    }
  }
  // id's position if it has one (false), else `pos`, now recorded (true).
  std::pair<int64_t, bool> TryEmplace(int64_t id, int64_t pos) {
    if (flat_.empty()) {
      auto [it, inserted] = map_.try_emplace(id, pos);
      return {it->second, inserted};
    }
    uint32_t& slot = flat_[static_cast<uint64_t>(id) - static_cast<uint64_t>(base_)];
    if (slot != 0) return {static_cast<int64_t>(slot) - 1, false};
    slot = static_cast<uint32_t>(pos + 1);
    return {pos, true};
  }
  void Clear() {
    if (flat_.empty()) {
      map_.clear();
    } else {
      std::fill(flat_.begin(), flat_.end(), 0u);
    }
  }

 private:
  static constexpr uint64_t kFlatMaxRange = uint64_t{1} << 26;  // 256 MiB at most
  int64_t base_ = 0;
  std::vector<uint32_t> flat_;  // position + 1, 0: none
  absl::flat_hash_map<int64_t, int64_t> map_;
};

}  // namespace

GradientPush SumInRankOrder(std::vector<GradientPush>& pushes) {
  if (pushes.size() == 1) return std::move(pushes[0]);
  // Per table: the range and count of its ids over every push.
  struct Extent {
    int64_t min_id = std::numeric_limits<int64_t>::max();
    int64_t max_id = std::numeric_limits<int64_t>::min();
    size_t ids = 0;
  };
  absl::flat_hash_map<int, Extent> extents;
  for (const GradientPush& push : pushes) {
    for (const TableGradients& tg : push) {
      Extent& e = extents[tg.table];
      for (const int64_t id : tg.ids) {
        e.min_id = std::min(e.min_id, id);
        e.max_id = std::max(e.max_id, id);
      }
      e.ids += tg.ids.size();
    }
  }
  // table -> position in `out`
  absl::flat_hash_map<int, size_t> table_pos;
  GradientPush out;
  std::vector<IdPositions> id_pos;
  for (GradientPush& push : pushes) {
    for (TableGradients& tg : push) {
      auto [it, inserted] = table_pos.try_emplace(tg.table, out.size());
      if (inserted) {
        // A table's first push is taken whole when its ids are distinct (the
        // server validated them): only later ranks' rows are copied or
        // summed, with the same result in the same order.
        const Extent& e = extents.at(tg.table);
        id_pos.emplace_back(e.min_id, e.max_id, e.ids);
        IdPositions& pos = id_pos.back();
        bool distinct = true;
        for (size_t i = 0; i < tg.ids.size() && distinct; ++i) {
          distinct = pos.TryEmplace(tg.ids[i], static_cast<int64_t>(i)).second;
        }
        if (distinct) {
          out.push_back(std::move(tg));
          continue;
        }
        pos.Clear();
        out.push_back(TableGradients{tg.table, tg.dim, {}, {}});
      }
      TableGradients& sum = out[it->second];
      sum.Own();  // a borrowed first push taken whole: later rows add to it
      IdPositions& pos = id_pos[it->second];
      const int dim = tg.dim;
      // Grown geometrically, at most once per push.
      const size_t values = tg.ids.size() * static_cast<size_t>(dim);
      if (const size_t need = sum.grads.size() + values; sum.grads.capacity() < need) {
        sum.grads.reserve(std::max(need, 2 * sum.grads.capacity()));
      }
      const float* const grads = tg.data();
      for (size_t i = 0; i < tg.ids.size(); ++i) {
        const float* g = grads + i * dim;
        auto [at, fresh] = pos.TryEmplace(tg.ids[i], static_cast<int64_t>(sum.ids.size()));
        if (fresh) {
          sum.ids.push_back(tg.ids[i]);
          sum.grads.insert(sum.grads.end(), g, g + dim);
        } else {
          float* acc = sum.grads.data() + at * dim;
          for (int j = 0; j < dim; ++j) acc[j] += g[j];
        }
      }
    }
  }
  return out;
}

}  // namespace recps::server

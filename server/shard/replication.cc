#include "server/shard/replication.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/wire/wire_format.h"

namespace recps::server {

void ForwardJoin::Arrive(absl::Status status) {
  absl::AnyInvocable<void(absl::Status) &&> then;
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && status_.ok()) status_ = std::move(status);
    if (--pending_ > 0 || !then_) return;
    then = std::move(then_);
    result = status_;
  }
  std::move(then)(std::move(result));
}

void ForwardJoin::Then(absl::AnyInvocable<void(absl::Status) &&> then) {
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (pending_ > 0) {
      then_ = std::move(then);
      return;
    }
    result = status_;
  }
  std::move(then)(std::move(result));
}

Replication::Replication(LayeredStore* store, const ShardServerOptions* options)
    : store_(store), options_(*options) {}

Replication::~Replication() { Shutdown(); }

void Replication::Shutdown() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  for (auto& [address, peer] : peers_) peer->Shutdown();
}

int64_t Replication::LagSteps(int64_t own_applied) const {
  absl::MutexLock lock(&mu_);
  int64_t lag = 0;
  for (const auto& [primary, clock] : clocks_) {
    lag = std::max(lag, own_applied - clock->applied_step());
  }
  return lag;
}

ShardPeer* Replication::PeerFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  if (stopped_ || !options_.connect_peer) return nullptr;
  std::unique_ptr<ShardPeer>& peer = peers_[address];
  if (peer == nullptr) peer = options_.connect_peer(address);
  return peer.get();
}

std::unique_ptr<StepClock> Replication::NewClock() {
  // Applies what the primary's clock applies: the same pushes, summed in
  // the same order, one step after the other (StepClock), into this
  // server's store. Forwards may arrive out of order: the primary answers
  // its lookups of step t + 1 once it applied step t itself, so a worker's
  // push of t + 1 can overtake another worker's forward of t. The window
  // takes them (they wait for their step); what a step sums and applies
  // stays the primary's.
  // The job's mode and window for lookups (a promoted server serves them
  // from this clock), a wider one for pushes.
  ConsistencyOptions replica = options_.consistency;
  replica.forward_window = kForwardWindow;
  replica.replica = true;
  return std::make_unique<StepClock>(replica, [this](GradientPush& push) {
    for (TableGradients& tg : push) {
      absl::Status s = store_->ApplyGradients(tg.table, tg.ids, tg.data());
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

void Replication::EnsureClocks(const ShardMapKeeper::View& view, const StepClock& own) {
  const ShardMap& map = view->map;
  if (view->self < 0 || !map.BacksAnything(view->self)) return;
  absl::MutexLock lock(&mu_);
  for (int p = 0; p < map.num_servers(); ++p) {
    const absl::Span<const uint32_t> backups = map.BackupServersOf(p);
    if (std::find(backups.begin(), backups.end(), static_cast<uint32_t>(view->self)) ==
        backups.end()) {
      continue;
    }
    std::unique_ptr<StepClock>& clock = clocks_[map.servers()[p]];
    if (clock != nullptr) continue;
    clock = NewClock();
    // A restored server's clock resumed at the cut (nothing pushed yet).
    if (!own.started() && own.applied_step() >= 0) {
      clock->ResumeAt(own.applied_step() + 1).IgnoreError();
    }
  }
}

void Replication::OnMapInstalled(const ShardMapKeeper::View& view, const StepClock& own) {
  EnsureClocks(view, own);
  {
    absl::MutexLock hold(&push_mu_);
    UpdateLineage(last_view_, view, own);
    absl::MutexLock lock(&mu_);
    lineage_epoch_ = view->map.epoch();
  }
  last_view_ = view;
}

absl::Status Replication::LineageReadyFor(uint64_t epoch) const {
  absl::MutexLock lock(&mu_);
  if (epoch <= lineage_epoch_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "this shard server is installing shard map epoch ", epoch,
      " (which clock steps each unit it owns is not known yet); retry shortly"));
}

uint64_t Replication::lineage_epoch() const {
  absl::MutexLock lock(&mu_);
  return lineage_epoch_;
}

Replication::LineageReport Replication::Report() const {
  absl::MutexLock lock(&mu_);
  LineageReport report;
  report.epoch = lineage_epoch_;
  report.lost_primary_clocks = lineage_ != nullptr ? static_cast<int>(lineage_->clocks.size()) : 0;
  return report;
}

void Replication::SetLineage(std::shared_ptr<const Lineage> lineage, bool own_steps_units) {
  const bool any = lineage != nullptr;
  lineage_ = std::move(lineage);
  has_lineage_.store(any, std::memory_order_release);
  own_clock_idle_.store(any && !own_steps_units, std::memory_order_release);
}

void Replication::MergeSettledLineages(StepClock* own) {
  if (!HasLineage() || options_.consistency.mode == ConsistencyMode::kAsync) return;
  // Only tries: a push between its split and its clocks holds it (shared),
  // and the next push tries again.
  if (!push_mu_.TryLock()) return;
  MergeSettled(own);
  push_mu_.Unlock();
}

void Replication::MergeSettled(StepClock* own) {
  std::shared_ptr<const Lineage> lineage;
  {
    absl::MutexLock lock(&mu_);
    lineage = lineage_;
  }
  if (lineage == nullptr) return;
  bool own_idle = OwnClockIdle();
  std::vector<int> renumber(1 + lineage->clocks.size(), 0);  // old k -> new k
  auto next = std::make_shared<Lineage>();
  std::vector<std::string> merged;
  for (size_t k = 0; k < lineage->clocks.size(); ++k) {
    StepClock* clock = lineage->clocks[k];
    const bool settled = clock->applied_step() > lineage->merge_after[k];
    // An own clock that stepped no unit starts where the lineage is.
    if (settled && own_idle && clock->BetweenSteps()) {
      own->AdoptStep(clock->applied_step()).IgnoreError();
    }
    if (settled && clock->MergeInto(own).ok()) {
      own_idle = false;
      merged.push_back(lineage->origins[k]);
      continue;
    }
    next->origins.push_back(lineage->origins[k]);
    next->clocks.push_back(clock);
    next->merge_after.push_back(lineage->merge_after[k]);
    renumber[k + 1] = static_cast<int>(next->clocks.size());
  }
  if (merged.empty()) return;
  bool any = false;
  next->num_slots = lineage->num_slots;
  next->table_keys = lineage->table_keys;
  next->clock_of_slot = lineage->clock_of_slot;
  for (std::vector<uint8_t>& clock_of : next->clock_of_slot) {
    bool table_any = false;
    for (uint8_t& k : clock_of) {
      k = static_cast<uint8_t>(renumber[k]);
      table_any = table_any || k != 0;
    }
    if (!table_any) clock_of.clear();
    any = any || table_any;
  }
  const int64_t step = own->applied_step();
  merged_at_step_.store(step, std::memory_order_release);
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& origin : merged) {
      auto it = clocks_.find(origin);
      if (it == clocks_.end()) continue;
      merged_.push_back(std::move(it->second));
      clocks_.erase(it);
    }
    SetLineage(any ? std::move(next) : nullptr, /*own_steps_units=*/true);
  }
  for (const std::string& origin : merged) {
    LogInfo("the units this server took over from lost primary ", origin,
            " step on its own clock from step ", step + 1,
            " on (every worker pushed to both since the failover): they can get a new backup");
  }
}

void Replication::UpdateLineage(const ShardMapKeeper::View& prev,
                                const ShardMapKeeper::View& next, const StepClock& own) {
  if (prev == nullptr || prev->self < 0 || next->self < 0) return;
  const ShardMap& before = prev->map;
  const ShardMap& after = next->map;
  std::shared_ptr<const Lineage> old;
  {
    absl::MutexLock lock(&mu_);
    old = lineage_;
  }
  auto lineage = std::make_shared<Lineage>();
  lineage->num_slots = after.num_slots();
  if (old != nullptr) {
    lineage->origins = old->origins;
    lineage->clocks = old->clocks;
    lineage->merge_after = old->merge_after;
  }
  bool any = false;
  bool own_steps_units = false;
  const int tables = store_->num_tables();
  lineage->clock_of_slot.resize(tables);
  lineage->table_keys.resize(tables);
  for (int t = 0; t < tables; ++t) {
    const uint64_t key = StableNameKey(store_->spec(t).name);
    lineage->table_keys[t] = key;
    const TableRoute to = after.RouteOf(key);
    const TableRoute from = before.RouteOf(key);
    if (to.column_split()) continue;
    std::vector<uint8_t>& clock_of = lineage->clock_of_slot[t];
    const std::vector<uint8_t>* had =
        old != nullptr && static_cast<size_t>(t) < old->clock_of_slot.size() &&
                !old->clock_of_slot[t].empty()
            ? &old->clock_of_slot[t]
            : nullptr;
    for (uint32_t slot = 0; slot < after.num_slots(); ++slot) {
      if (to.OwnerOfSlot(slot) != next->self) continue;
      uint8_t k = 0;
      const int was = from.OwnerOfSlot(slot);
      if (was == prev->self) {
        k = had != nullptr ? (*had)[slot] : 0;  // owned before: as it was
      } else if (was >= 0) {
        // Promoted: it was backed here, on the clock of its primary's pushes
        // (units with backups are always on their owner's own lineage).
        const absl::Span<const uint32_t> backups = from.BackupsOfSlot(slot);
        if (std::find(backups.begin(), backups.end(), static_cast<uint32_t>(prev->self)) !=
            backups.end()) {
          const std::string& origin = before.servers()[was];
          auto at = std::find(lineage->origins.begin(), lineage->origins.end(), origin);
          if (at == lineage->origins.end()) {
            StepClock* clock = ClockOf(origin);
            if (clock == nullptr) {  // never backed it: own clock
              own_steps_units = true;
              continue;
            }
            lineage->origins.push_back(origin);
            lineage->clocks.push_back(clock);
            lineage->merge_after.push_back(std::max(own.newest_step(), clock->newest_step()));
            at = lineage->origins.end() - 1;
          }
          k = static_cast<uint8_t>(1 + (at - lineage->origins.begin()));
        }
      }
      if (k == 0) {
        own_steps_units = true;
        continue;
      }
      if (clock_of.empty()) clock_of.assign(after.num_slots(), 0);
      clock_of[slot] = k;
      any = true;
    }
  }
  absl::MutexLock lock(&mu_);
  SetLineage(any ? std::move(lineage) : nullptr, own_steps_units);
}

bool Replication::HasLineage() const { return has_lineage_.load(std::memory_order_acquire); }

std::vector<StepClock*> Replication::LineageClocks() const {
  if (!HasLineage()) return {};
  absl::MutexLock lock(&mu_);
  return lineage_ != nullptr ? lineage_->clocks : std::vector<StepClock*>{};
}

std::vector<Replication::ClockPart> Replication::SplitByLineage(StepClock* own,
                                                                GradientPush push) const {
  std::shared_ptr<const Lineage> lineage;
  if (HasLineage()) {
    absl::MutexLock lock(&mu_);
    lineage = lineage_;
  }
  std::vector<ClockPart> out;
  if (lineage == nullptr) {
    out.push_back({own, std::move(push)});
    return out;
  }
  out.resize(1 + lineage->clocks.size());
  out[0].clock = own;
  for (size_t k = 0; k < lineage->clocks.size(); ++k) out[k + 1].clock = lineage->clocks[k];
  for (TableGradients& tg : push) {
    const std::vector<uint8_t>* clock_of =
        static_cast<size_t>(tg.table) < lineage->clock_of_slot.size() &&
                !lineage->clock_of_slot[tg.table].empty()
            ? &lineage->clock_of_slot[tg.table]
            : nullptr;
    if (clock_of == nullptr) {  // the whole table on the own clock
      out[0].push.push_back(std::move(tg));
      continue;
    }
    std::vector<TableGradients> parts(out.size());
    for (TableGradients& p : parts) {
      p.table = tg.table;
      p.dim = tg.dim;
    }
    const uint64_t key = lineage->table_keys[tg.table];
    for (size_t i = 0; i < tg.ids.size(); ++i) {
      const uint8_t k = (*clock_of)[SlotOf(key, tg.ids[i], lineage->num_slots)];
      TableGradients& p = parts[k];
      p.ids.push_back(tg.ids[i]);
      const float* row = tg.data() + i * static_cast<size_t>(tg.dim);
      p.grads.insert(p.grads.end(), row, row + tg.dim);
    }
    for (size_t k = 0; k < parts.size(); ++k) {
      if (!parts[k].ids.empty()) out[k].push.push_back(std::move(parts[k]));
    }
  }
  return out;
}

absl::Status Replication::CheckOwnClock(absl::Span<const StoreUnit> units) const {
  if (!HasLineage()) return absl::OkStatus();
  std::shared_ptr<const Lineage> lineage;
  {
    absl::MutexLock lock(&mu_);
    lineage = lineage_;
  }
  if (lineage == nullptr) return absl::OkStatus();
  for (const auto& [table, slot] : units) {
    if (static_cast<size_t>(table) >= lineage->clock_of_slot.size()) continue;
    const std::vector<uint8_t>& clock_of = lineage->clock_of_slot[table];
    if (clock_of.empty() || slot >= clock_of.size() || clock_of[slot] == 0) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "slot ", slot, " of table ", store_->spec(table).name,
        " steps on the clock of lost primary ", lineage->origins[clock_of[slot] - 1],
        " (this server took it over at a failover); it can get a new backup once it steps "
        "on this server's own clock (after every worker pushed a step here since the "
        "failover; never in async mode)"));
  }
  return absl::OkStatus();
}

absl::Status Replication::JoinAsBackup(const std::string& primary, int64_t step) {
  StepClock* existing = nullptr;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<StepClock>& clock = clocks_[primary];
    if (clock == nullptr) {
      clock = NewClock();
      absl::Status s = step >= 0 ? clock->AdoptStep(step) : absl::OkStatus();
      if (!s.ok()) clocks_.erase(primary);
      return s;
    }
    if (lineage_ != nullptr && std::find(lineage_->clocks.begin(), lineage_->clocks.end(),
                                         clock.get()) != lineage_->clocks.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this server steps units it took over from ", primary, " on its clock of ", primary,
          "; it cannot also back a new server at that address"));
    }
    existing = clock.get();  // backs other units of it: takes its every push
  }
  // The copied rows hold every step up to `step`. This clock may not have
  // applied the last of them yet (the primary applies a step while its
  // forwards are on their way): until it has, a worker's retry of such a
  // step, forwarded again by the new map, would add the new units' ids to
  // the pending step and apply them a second time. Once it has, the retry
  // is a push of an applied step, dropped.
  if (step < 0) return absl::OkStatus();
  return existing->WaitApplied(step, options_.consistency.step_timeout);
}

absl::Status Replication::ResumeAt(int64_t step) {
  absl::MutexLock lock(&mu_);
  for (auto& [primary, clock] : clocks_) RETURN_IF_ERROR(clock->ResumeAt(step));
  return absl::OkStatus();
}

absl::Status Replication::Restart(int64_t step) {
  absl::MutexLock lock(&mu_);
  for (auto& [primary, clock] : clocks_) RETURN_IF_ERROR(clock->Restart(step));
  return absl::OkStatus();
}

StepClock* Replication::ClockOf(const std::string& primary) {
  absl::MutexLock lock(&mu_);
  auto it = clocks_.find(primary);
  return it == clocks_.end() ? nullptr : it->second.get();
}

std::shared_ptr<ForwardJoin> Replication::Forward(const ShardMapKeeper::View& view,
                                                  const v1::RequestHeader& header,
                                                  const GradientPush& push) {
  const ShardMap& map = view->map;
  // Every backup of this server's units gets every push, with the ids (and
  // their gradient rows) it backs, none at times: its clock of this
  // primary must see each worker arrive at each step, as this server's does.
  absl::flat_hash_map<uint32_t, v1::ReplicatePushRequest> requests;
  for (uint32_t b : map.BackupServersOf(view->self)) requests[b];
  std::vector<int64_t> ids;
  for (const TableGradients& tg : push) {
    const config::TableSpec& spec = store_->spec(tg.table);
    const TableRoute route = map.RouteOf(StableNameKey(spec.name));
    // The backups of this table's ids, with the positions each backs.
    absl::flat_hash_map<uint32_t, std::vector<size_t>> positions;
    for (size_t i = 0; i < tg.ids.size(); ++i) {
      for (uint32_t b : route.BackupsOf(tg.ids[i])) {
        if (b != kNoBackup) positions[b].push_back(i);
      }
    }
    const size_t row_bytes = static_cast<size_t>(tg.dim) * sizeof(float);
    for (auto& [backup, at] : positions) {
      v1::ReplicatePushRequest& r = requests[backup];
      v1::TableGradients* t = r.mutable_push()->add_tables();
      t->set_table(spec.name);
      t->set_encoding(v1::ROW_ENCODING_FLOAT32);
      ids.clear();
      std::string* grads = t->mutable_grads();
      grads->resize(at.size() * row_bytes);
      for (size_t k = 0; k < at.size(); ++k) {
        ids.push_back(tg.ids[at[k]]);
        std::memcpy(grads->data() + k * row_bytes, tg.data() + at[k] * tg.dim, row_bytes);
      }
      EncodeIds(ids, t->mutable_ids());
    }
  }
  if (requests.empty()) return nullptr;  // no backups (left)
  auto join = std::make_shared<ForwardJoin>(static_cast<int>(requests.size()));
  for (auto& [backup, request] : requests) {
    request.set_primary(view->self_address);
    v1::RequestHeader* h = request.mutable_push()->mutable_header();
    *h = header;
    // The worker's view of the primary's incarnation is not the backup's.
    h->clear_incarnation();
    const std::string& address = map.servers()[backup];
    ShardPeer* peer = PeerFor(address);
    if (peer == nullptr) {
      join->Arrive(absl::UnavailableError(absl::StrCat(
          "cannot forward the push to backup ", address, ": this server is stopping or "
          "cannot reach other shard servers")));
      continue;
    }
    peer->ReplicatePush(std::move(request), options_.replicate_timeout,
                        [join, address](absl::Status s) {
                          if (!s.ok()) {
                            absl::Status named(s.code(), absl::StrCat("backup ", address,
                                                                      " did not take the push: ",
                                                                      s.message()));
                            s.ForEachPayload([&](absl::string_view key, const absl::Cord& v) {
                              named.SetPayload(key, v);
                            });
                            s = std::move(named);
                          }
                          join->Arrive(std::move(s));
                        });
  }
  return join;
}

absl::Status Replication::ApplyForwarded(const std::string& primary,
                                         const v1::RequestHeader& header, GradientPush push) {
  StepClock* clock = ClockOf(primary);
  if (clock == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no installed shard map made this server a backup of ", primary));
  }
  return clock->Push(header.worker_rank(), header.step(), std::move(push),
                     header.push_part());
}

}  // namespace recps::server

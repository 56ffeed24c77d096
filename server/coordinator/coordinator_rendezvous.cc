// The coordinator's key-value store, waits and barriers (rendezvous for
// NCCL and Gloo). Waits are pending callbacks, finished by KvSet, a
// completing arrival, Tick() (timeouts) or CancelWaits(): no thread blocks.
#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/coordinator/coordinator.h"

namespace recps::server {
namespace {

constexpr char kKvPrefix[] = "kv/";
constexpr size_t kMaxBarrierNameBytes = 256;
// Keys one KvWait may wait for (Gloo waits for a handful): every KvSet
// looks at each pending wait's keys under the lock.
constexpr size_t kMaxKvWaitKeys = 256;
// Names listed in a barrier's timeout message; the rest are counted.
constexpr int kMaxListed = 16;

// "a, b, c" for the first kMaxListed items, then "... (N in all)".
template <typename T>
std::string JoinSome(const std::vector<T>& items) {
  if (items.size() <= static_cast<size_t>(kMaxListed)) return absl::StrJoin(items, ", ");
  std::vector<T> head(items.begin(), items.begin() + kMaxListed);
  return absl::StrCat(absl::StrJoin(head, ", "), ", ... (", items.size(), " in all)");
}

}  // namespace

std::string Coordinator::KvScope() const {
  return absl::StrCat(kKvPrefix, job_.name().size(), ":", job_.name(), "/");
}

absl::Status Coordinator::LoadKv() {
  kv_.clear();
  kv_bytes_ = 0;
  kv_owner_.clear();
  for (auto& [client, usage] : usage_) usage.kv_keys = usage.kv_bytes = 0;
  const std::string scope = KvScope();
  ASSIGN_OR_RETURN(auto kv, store_->Scan(kKvPrefix));
  int dropped = 0;
  for (auto& [key, value] : kv) {
    if (!absl::StartsWith(key, scope)) {
      // Another job's (or an older layout's): not this job's to see.
      RETURN_IF_ERROR(store_->Delete(key));
      ++dropped;
      continue;
    }
    std::string name = key.substr(scope.size());
    kv_bytes_ += static_cast<int64_t>(name.size() + value.size());
    kv_[std::move(name)] = std::move(value);
  }
  if (dropped > 0) {
    LogInfo("dropped ", dropped, " key-value entries of another job");
  }
  return absl::OkStatus();
}

void Coordinator::ClearKv() {
  for (const auto& [key, value] : kv_) {
    if (absl::Status s = store_->Delete(absl::StrCat(KvScope(), key)); !s.ok()) {
      LogWarning("dropping key-value entry '", key, "': ", s.message());
    }
  }
  kv_.clear();
  kv_bytes_ = 0;
  kv_owner_.clear();
  for (auto& [client, usage] : usage_) usage.kv_keys = usage.kv_bytes = 0;
}

absl::Status Coordinator::TakeWaitSlot(const std::string& client, absl::string_view what) {
  if (client.empty()) return absl::OkStatus();
  ClientUsage& usage = usage_[client];
  if (usage.waits >= options_.max_waits_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", client, " has ", usage.waits,
        " waits and barrier arrivals pending, the limit per client is ",
        options_.max_waits_per_client, " (--max_waits_per_client)"));
  }
  ++usage.waits;
  return absl::OkStatus();
}

void Coordinator::ReleaseWaitSlot(const std::string& client) {
  if (client.empty()) return;
  auto it = usage_.find(client);
  if (it == usage_.end()) return;
  if (--it->second.waits <= 0 && it->second.kv_keys == 0) usage_.erase(it);
}

absl::Status Coordinator::CheckKvKey(absl::string_view what,
                                     const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty key"));
  if (static_cast<int64_t>(key.size()) > options_.max_kv_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": key '", key.substr(0, 32), "...' is ", key.size(),
        " bytes, the limit is ", options_.max_kv_key_bytes, " (--max_kv_key_bytes)"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::KvSet(const std::string& key, std::string value,
                                const Caller& caller) {
  RETURN_IF_ERROR(CheckKvKey("kv set", key));
  if (static_cast<int64_t>(value.size()) > options_.max_kv_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv set '", key, "': value is ", value.size(), " bytes, the limit is ",
        options_.max_kv_value_bytes, " (--max_kv_value_bytes)"));
  }
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto it = kv_.find(key);
    const int64_t old_bytes =
        it == kv_.end() ? 0 : static_cast<int64_t>(key.size() + it->second.size());
    const int64_t new_bytes = static_cast<int64_t>(key.size() + value.size());
    if (it == kv_.end() && static_cast<int64_t>(kv_.size()) >= options_.max_kv_keys) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "kv set '", key, "': the job has ", kv_.size(), " keys, the limit is ",
          options_.max_kv_keys, " (--max_kv_keys)"));
    }
    if (kv_bytes_ - old_bytes + new_bytes > options_.max_kv_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "kv set '", key, "': the job's keys and values would take ",
          kv_bytes_ - old_bytes + new_bytes, " bytes, the limit is ",
          options_.max_kv_bytes, " (--max_kv_bytes)"));
    }
    // A key counts against the client that created it (nobody's when it
    // was created unchecked or loaded from the state).
    std::string owner;
    if (it == kv_.end()) {
      owner = caller.client;
    } else if (auto o = kv_owner_.find(key); o != kv_owner_.end()) {
      owner = o->second;
    }
    if (!owner.empty()) {
      const ClientUsage& usage = usage_[owner];
      if (it == kv_.end() && usage.kv_keys >= options_.max_kv_keys_per_client) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "kv set '", key, "': ", owner, " created ", usage.kv_keys,
            " keys, the limit per client is ", options_.max_kv_keys_per_client,
            " (--max_kv_keys_per_client)"));
      }
      if (usage.kv_bytes - old_bytes + new_bytes > options_.max_kv_bytes_per_client) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "kv set '", key, "': ", owner, "'s keys and values would take ",
            usage.kv_bytes - old_bytes + new_bytes, " bytes, the limit per client is ",
            options_.max_kv_bytes_per_client, " (--max_kv_bytes_per_client)"));
      }
    }
    RETURN_IF_ERROR(store_->Put(absl::StrCat(KvScope(), key), value));
    kv_bytes_ += new_bytes - old_bytes;
    if (!owner.empty()) {
      ClientUsage& usage = usage_[owner];
      if (it == kv_.end()) ++usage.kv_keys;
      usage.kv_bytes += new_bytes - old_bytes;
      kv_owner_[key] = owner;
    }
    kv_[key] = std::move(value);
    CompleteKvWaiters(&deferred);
  }
  deferred.Run(this);
  return absl::OkStatus();
}

void Coordinator::CompleteKvWaiters(Deferred* deferred) {
  for (auto it = kv_waiters_.begin(); it != kv_waiters_.end();) {
    bool all = true;
    for (const std::string& key : it->keys) all = all && kv_.contains(key);
    if (!all) {
      ++it;
      continue;
    }
    deferred->calls.push_back([done = std::move(it->done),
                               value = kv_[it->keys.back()]]() mutable {
      std::move(done)(std::move(value));
    });
    ReleaseWaitSlot(it->client);
    it = kv_waiters_.erase(it);
  }
}

absl::Status Coordinator::TooManyWaiters(absl::string_view what) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": ", options_.max_members, " waits are pending already, the limit is ",
      options_.max_members, " (--max_members)"));
}

void Coordinator::KvGet(const std::string& key, absl::Duration wait,
                        ValueDone done, const Caller& caller) {
  if (absl::Status s = CheckKvKey("kv get", key); !s.ok()) {
    std::move(done)(s);
    return;
  }
  absl::StatusOr<std::string> result;
  {
    absl::MutexLock lock(&mu_);
    auto it = kv_.find(key);
    if (it != kv_.end()) {
      result = it->second;
    } else if (wait <= absl::ZeroDuration()) {
      result = absl::NotFoundError(absl::StrCat("kv get: no key '", key, "'"));
    } else if (kv_waiters_.size() >= static_cast<size_t>(options_.max_members)) {
      result = TooManyWaiters("kv get");
    } else if (absl::Status s = TakeWaitSlot(caller.client, "kv get"); !s.ok()) {
      result = s;
    } else {
      kv_waiters_.push_back(
          {{key}, Now() + CapWait(wait), std::move(done), caller.client, caller.wait_id});
      return;
    }
  }
  std::move(done)(std::move(result));
}

void Coordinator::KvWait(std::vector<std::string> keys, absl::Duration timeout,
                         Done done, const Caller& caller) {
  if (keys.empty()) {
    std::move(done)(absl::OkStatus());
    return;
  }
  if (keys.size() > kMaxKvWaitKeys) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "kv wait: ", keys.size(), " keys, the limit is ", kMaxKvWaitKeys)));
    return;
  }
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKvKey("kv wait", key); !s.ok()) {
      std::move(done)(s);
      return;
    }
  }
  if (timeout <= absl::ZeroDuration()) timeout = options_.default_wait;
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    absl::Status refused = kv_waiters_.size() >= static_cast<size_t>(options_.max_members)
                               ? TooManyWaiters("kv wait")
                               : TakeWaitSlot(caller.client, "kv wait");
    if (!refused.ok()) {
      deferred.calls.push_back([done = std::move(done), refused]() mutable {
        std::move(done)(refused);
      });
    } else {
      kv_waiters_.push_back(
          {std::move(keys), Now() + CapWait(timeout),
           [done = std::move(done)](absl::StatusOr<std::string> v) mutable {
             std::move(done)(v.status());
           },
           caller.client, caller.wait_id});
    }
    CompleteKvWaiters(&deferred);  // maybe every key is there already
  }
  deferred.Run(this);
}

void Coordinator::ExpireKvWaiters(absl::Time now, Deferred* deferred) {
  for (auto it = kv_waiters_.begin(); it != kv_waiters_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    std::vector<std::string> missing;
    for (const std::string& key : it->keys) {
      if (!kv_.contains(key)) missing.push_back(key);
    }
    absl::Status error = absl::DeadlineExceededError(
        absl::StrCat("kv: timed out waiting for key(s) ", absl::StrJoin(missing, ", ")));
    deferred->calls.push_back([done = std::move(it->done), error]() mutable {
      std::move(done)(error);
    });
    ReleaseWaitSlot(it->client);
    it = kv_waiters_.erase(it);
  }
}

int32_t Coordinator::MaxBarrierCount() const {
  return options_.world_size > 0 ? options_.world_size : options_.max_members;
}

void Coordinator::Barrier(const v1::BarrierRequest& request, Done done,
                          const Caller& caller) {
  const std::string& name = request.name();
  // Checked before taking the lock: nothing below may do work proportional
  // to a count the client picked.
  const int32_t max_count = MaxBarrierCount();
  absl::Status invalid;
  if (name.empty()) {
    invalid = absl::InvalidArgumentError("barrier: empty name");
  } else if (name.size() > kMaxBarrierNameBytes) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        "barrier: name is ", name.size(), " bytes, the limit is ",
        kMaxBarrierNameBytes));
  } else if (request.count() < 1) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat("barrier '", name, "': count must be >= 1"));
  } else if (request.count() > max_count) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        "barrier '", name, "': count ", request.count(), " is above the limit ",
        max_count,
        options_.world_size > 0 ? " (the job's world size, --world_size)"
                                : " (--max_members; --world_size not set)"));
  } else if (request.rank() >= request.count()) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        "barrier '", name, "': rank ", request.rank(), " is not below count ",
        request.count()));
  } else if (request.rank() < 0 && request.member_id().empty()) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat("barrier '", name, "': give a rank or a member_id"));
  } else if (request.member_id().size() > kMaxBarrierNameBytes) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        "barrier '", name, "': member_id is ", request.member_id().size(),
        " bytes, the limit is ", kMaxBarrierNameBytes));
  }
  if (!invalid.ok()) {
    std::move(done)(invalid);
    return;
  }
  const std::string who = request.rank() >= 0
                              ? absl::StrCat("rank ", request.rank())
                              : absl::StrCat("member ", request.member_id());
  // Cut to max_wait: a barrier nobody completes must not hold its slot
  // for ever (absl::Milliseconds of a huge count is infinite).
  const absl::Duration timeout = CapWait(request.timeout_ms() > 0
                                             ? absl::Milliseconds(request.timeout_ms())
                                             : options_.default_wait);
  std::vector<Done> ready;
  {
    absl::MutexLock lock(&mu_);
    auto it = barriers_.find(name);
    invalid = TakeWaitSlot(caller.client, absl::StrCat("barrier '", name, "'"));
    const bool took_slot = invalid.ok();
    if (!invalid.ok()) {
      // refused: the caller's quota
    } else if (it == barriers_.end()) {
      if (barriers_.size() >= static_cast<size_t>(options_.max_members)) {
        invalid = absl::ResourceExhaustedError(absl::StrCat(
            "barrier '", name, "': ", barriers_.size(),
            " barriers are open already, the limit is ", options_.max_members,
            " (--max_members)"));
      } else {
        it = barriers_.emplace(name, BarrierState()).first;
        it->second.count = request.count();
      }
    }
    if (!invalid.ok()) {
      // refused above
    } else if (BarrierState& barrier = it->second; barrier.count != request.count()) {
      invalid = absl::InvalidArgumentError(
          absl::StrCat("barrier '", name, "': count ", request.count(),
                       " differs from the ", barrier.count, " of earlier arrivals"));
    } else {
      const absl::Time deadline = Now() + timeout;
      barrier.arrived[who] = request.rank();
      barrier.earliest_deadline = std::min(barrier.earliest_deadline, deadline);
      barrier.waiters.push_back(
          {who, request.rank(), deadline, std::move(done), caller.client, caller.wait_id});
      if (static_cast<int32_t>(barrier.arrived.size()) >= barrier.count) {
        for (BarrierWaiter& w : barrier.waiters) {
          ready.push_back(std::move(w.done));
          ReleaseWaitSlot(w.client);
        }
        barriers_.erase(it);  // complete: the name can be used again
      }
    }
    if (!invalid.ok() && took_slot) ReleaseWaitSlot(caller.client);  // nothing waits
  }
  if (!invalid.ok()) {
    std::move(done)(invalid);
    return;
  }
  for (Done& d : ready) std::move(d)(absl::OkStatus());
}

std::string Coordinator::MissingFromBarrier(const std::string& name,
                                            const BarrierState& barrier) const {
  std::vector<std::string> arrived;
  std::set<int32_t> ranks;
  for (const auto& [who, rank] : barrier.arrived) {
    arrived.push_back(who);
    if (rank >= 0) ranks.insert(rank);
  }
  std::string message = absl::StrCat(
      "barrier '", name, "': ", barrier.arrived.size(), " of ", barrier.count,
      " arrived (", JoinSome(arrived), ")");
  if (!ranks.empty()) {
    std::vector<int32_t> missing;
    for (int32_t r = 0; r < barrier.count; ++r) {
      if (ranks.count(r) == 0) missing.push_back(r);
    }
    absl::StrAppend(&message, "; missing rank(s) ", JoinSome(missing));
  } else {
    // Arrivals by member id: name the workers that did not come.
    std::vector<std::string> absent;
    for (const auto& [id, e] : members_) {
      if (e.record.role() == v1::WORKER && barrier.arrived.count("member " + id) == 0) {
        absent.push_back(absl::StrCat(id, e.record.state() == v1::EXPIRED ? " (expired)" : ""));
      }
    }
    std::sort(absent.begin(), absent.end());
    absl::StrAppend(&message, "; missing ", barrier.count - barrier.arrived.size(),
                    absent.empty() ? "" : ", workers not arrived: ",
                    JoinSome(absent));
  }
  return message;
}

void Coordinator::ExpireBarrierWaiters(absl::Time now, Deferred* deferred) {
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    BarrierState& barrier = it->second;
    // Most ticks find nothing due: no per-barrier work then.
    if (barrier.earliest_deadline > now) {
      ++it;
      continue;
    }
    const std::string message = MissingFromBarrier(it->first, barrier);
    std::vector<BarrierWaiter> kept;
    barrier.earliest_deadline = absl::InfiniteFuture();
    for (BarrierWaiter& w : barrier.waiters) {
      if (w.deadline > now) {
        barrier.earliest_deadline = std::min(barrier.earliest_deadline, w.deadline);
        kept.push_back(std::move(w));
        continue;
      }
      LogWarning(message, ": ", w.who, " timed out");
      ReleaseWaitSlot(w.client);
      deferred->calls.push_back(
          [done = std::move(w.done), error = absl::DeadlineExceededError(message)]() mutable {
            std::move(done)(error);
          });
    }
    barrier.waiters = std::move(kept);
    // Whoever timed out no longer waits, so no longer counts as arrived.
    std::map<std::string, int32_t> still;
    for (const BarrierWaiter& w : barrier.waiters) still[w.who] = w.rank;
    barrier.arrived = std::move(still);
    it = barrier.waiters.empty() ? barriers_.erase(it) : std::next(it);
  }
}

void Coordinator::CancelWait(int64_t wait_id) {
  if (wait_id == 0) return;
  Done barrier_done;
  ValueDone kv_done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = kv_waiters_.begin(); it != kv_waiters_.end(); ++it) {
      if (it->wait_id != wait_id) continue;
      kv_done = std::move(it->done);
      ReleaseWaitSlot(it->client);
      kv_waiters_.erase(it);
      break;
    }
    for (auto b = barriers_.begin(); !kv_done && b != barriers_.end(); ++b) {
      BarrierState& barrier = b->second;
      auto w = std::find_if(barrier.waiters.begin(), barrier.waiters.end(),
                            [&](const BarrierWaiter& x) { return x.wait_id == wait_id; });
      if (w == barrier.waiters.end()) continue;
      barrier_done = std::move(w->done);
      ReleaseWaitSlot(w->client);
      const std::string who = w->who;
      barrier.waiters.erase(w);
      // Gone callers no longer count as arrived (unless they wait again).
      const bool still_waits =
          std::any_of(barrier.waiters.begin(), barrier.waiters.end(),
                      [&](const BarrierWaiter& x) { return x.who == who; });
      if (!still_waits) barrier.arrived.erase(who);
      if (barrier.waiters.empty()) barriers_.erase(b);
      break;
    }
  }
  const absl::Status cancelled = absl::CancelledError("the caller went away");
  if (kv_done) std::move(kv_done)(cancelled);
  if (barrier_done) std::move(barrier_done)(cancelled);
}

void Coordinator::CancelWaits(const absl::Status& status) {
  std::vector<KvWaiter> kv;
  std::map<std::string, BarrierState> barriers;
  {
    absl::MutexLock lock(&mu_);
    kv.swap(kv_waiters_);
    barriers.swap(barriers_);
    for (auto& [client, usage] : usage_) usage.waits = 0;
  }
  for (KvWaiter& w : kv) std::move(w.done)(status);
  for (auto& [name, barrier] : barriers) {
    for (BarrierWaiter& w : barrier.waiters) std::move(w.done)(status);
  }
  if (checkpoints_ != nullptr) checkpoints_->CancelWaits(status);
}

}  // namespace recps::server

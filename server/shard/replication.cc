#include "server/shard/replication.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
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
  ConsistencyOptions replica = options_.consistency;
  if (replica.mode != ConsistencyMode::kAsync) {
    replica.mode = ConsistencyMode::kBounded;
    replica.staleness += kForwardWindow;
  }
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
                            s = absl::Status(s.code(), absl::StrCat("backup ", address,
                                                                    " did not take the push: ",
                                                                    s.message()));
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

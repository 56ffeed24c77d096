// Members, leases, the shard map and the job. Key-value store, waits and
// barriers: coordinator_rendezvous.cc.
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_metrics.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config.h"
#include "common/log.h"
#include "common/rpc/address.h"
#include "common/wire/shard_map.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace recps::server {
namespace {

constexpr char kMemberPrefix[] = "member/";
constexpr char kJobKey[] = "job";
constexpr char kJobStartedKey[] = "job_started";

const char* RoleName(v1::MemberRole role) { return MemberRoleName(role); }

int64_t ToUnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

}  // namespace

absl::Status CheckMemberAddress(const std::string& address) {
  absl::Status s = rpc::CheckHostPort(address);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat("register: ", s.message()));
}


void Coordinator::Deferred::Run(Coordinator* c) {
  for (auto& call : calls) std::move(call)();
  for (const v1::ShardMap& map : published) c->Publish(map);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    std::unique_ptr<CoordinatorStore> store, CoordinatorOptions options,
    prometheus::Registry* registry) {
  if (store == nullptr) return absl::InvalidArgumentError("no store");
  if (options.num_shards < 0) {
    return absl::InvalidArgumentError("num_shards must be >= 0");
  }
  if (options.num_slots == 0) return absl::InvalidArgumentError("num_slots must be > 0");
  if (options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease must be positive");
  }
  if (options.world_size < 0) {
    return absl::InvalidArgumentError("world_size must be >= 0 (0: not known)");
  }
  if (options.max_kv_key_bytes < 1 || options.max_kv_value_bytes < 0 ||
      options.max_kv_keys < 1 || options.max_kv_bytes < 1) {
    return absl::InvalidArgumentError("the kv limits must be positive");
  }
  if (options.max_members < 1) {
    return absl::InvalidArgumentError("max_members must be >= 1");
  }
  if (!options.clock) options.clock = [] { return absl::Now(); };
  std::unique_ptr<Coordinator> c(
      new Coordinator(std::move(store), std::move(options), registry));
  RETURN_IF_ERROR(c->Load());
  c->checkpoints_ = std::make_unique<CheckpointOrchestrator>(
      c.get(), c->store_.get(), c->options_.checkpoint, c->options_.world_size,
      c->options_.clock, registry);
  c->moves_ = std::make_unique<MoveOrchestrator>(c.get(), c->store_.get(), c->options_.moves,
                                                 c->options_.clock, registry);
  return c;
}

Coordinator::Coordinator(std::unique_ptr<CoordinatorStore> store,
                         CoordinatorOptions options, prometheus::Registry* registry)
    : store_(std::move(store)),
      options_(std::move(options)),
      plans_(store_.get(), options_.sharding, options_.plan_spec, options_.num_slots,
             options_.world_size) {
  if (registry != nullptr) metrics_ = std::make_unique<CoordinatorMetrics>(*registry);
}

absl::StatusOr<v1::ShardingPlan> Coordinator::GetPlan() const {
  absl::MutexLock lock(&mu_);
  return plans_.Get();
}

Coordinator::~Coordinator() {
  moves_.reset();
  checkpoints_.reset();
  CancelWaits(absl::CancelledError("coordinator closed"));
}

absl::Status Coordinator::Load() {
  absl::MutexLock lock(&mu_);
  // A restarted coordinator gives every live member a fresh lease: it cannot
  // know what it missed while down.
  const absl::Time now = Now();
  ASSIGN_OR_RETURN(auto members, store_->Scan(kMemberPrefix));
  for (const auto& [key, value] : members) {
    MemberEntry entry;
    if (!entry.record.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("coordinator state in ", store_->path(),
                                              ": cannot parse ", key));
    }
    entry.last_heartbeat = now;
    members_.Add(std::move(entry));
  }
  absl::StatusOr<std::string> map = store_->Get(kShardMapKey);
  if (map.ok()) {
    if (!map_.ParseFromString(*map) || !ShardMap::FromProto(map_).ok()) {
      return absl::DataLossError(absl::StrCat("coordinator state in ", store_->path(),
                                              ": the stored shard map is malformed"));
    }
    if (map_.num_slots() != options_.num_slots) {
      LogWarning("the stored shard map has ", map_.num_slots(), " slots, not ",
                 options_.num_slots, " as asked: keeping the stored map");
    }
  } else if (!absl::IsNotFound(map.status())) {
    return map.status();
  }
  absl::StatusOr<std::string> job = store_->Get(kJobKey);
  if (job.ok()) {
    if (!job_.ParseFromString(*job)) {
      return absl::DataLossError(absl::StrCat("coordinator state in ", store_->path(),
                                              ": the stored job is malformed"));
    }
    has_job_ = true;
  } else if (!absl::IsNotFound(job.status())) {
    return job.status();
  }
  absl::StatusOr<std::string> started = store_->Get(kJobStartedKey);
  if (started.ok()) {
    job_started_ = *std::move(started);
  } else if (!absl::IsNotFound(started.status())) {
    return started.status();
  }
  RETURN_IF_ERROR(plans_.Load());
  RETURN_IF_ERROR(LoadKv());
  UpdateMapGauges();
  UpdateMemberGauges();
  return absl::OkStatus();
}

void Coordinator::SetMapPusher(MapPusher pusher) {
  absl::MutexLock lock(&mu_);
  pusher_ = std::move(pusher);
}

absl::Status Coordinator::SetJob(const v1::JobConfig& job, bool replace) {
  if (absl::Status s = config::ValidateJobConfig(job); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job: ", s.message()));
  }
  absl::MutexLock lock(&mu_);
  if (has_job_) {
    if (google::protobuf::util::MessageDifferencer::Equals(job_, job)) {
      return absl::OkStatus();
    }
    std::string diff;
    {
      google::protobuf::util::MessageDifferencer differencer;
      differencer.ReportDifferencesToString(&diff);
      differencer.Compare(job_, job);
    }
    if (diff.size() > 300) diff = absl::StrCat(diff.substr(0, 300), "...");
    const std::string what = absl::StrCat(
        "the state in ", store_->path(), " holds a different job ('", job_.name(),
        "'; differs in: ", absl::StripAsciiWhitespace(diff), ")");
    if (!job_started_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " and training progressed: ", job_started_,
          ", so the shard servers may hold its rows; it cannot be replaced. "
          "Run without --job to keep it, or start the new job with a fresh "
          "--state_dir"));
    }
    if (!replace) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ". No worker has registered for it yet (no training progress), "
          "so it may be replaced: restart with --replace_job, or run without "
          "--job to keep it"));
    }
    RETURN_IF_ERROR(store_->Put(kJobKey, job.SerializeAsString()));
    LogWarning(what, ": replaced (--replace_job; no worker had registered for it)");
    // The old job's rendezvous entries are not the new job's.
    for (const auto& [key, value] : kv_) {
      RETURN_IF_ERROR(store_->Delete(absl::StrCat(KvScope(), key)));
    }
    job_ = job;
    return LoadKv();
  }
  RETURN_IF_ERROR(store_->Put(kJobKey, job.SerializeAsString()));
  job_ = job;
  has_job_ = true;
  return LoadKv();
}

absl::Status Coordinator::StoredJobStatus() const {
  absl::MutexLock lock(&mu_);
  if (!has_job_) return absl::OkStatus();
  if (absl::Status s = config::ValidateJobConfig(job_); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job stored in ", store_->path(), " is invalid: ", s.message(),
        "; restart with --job=FILE (a valid job) and --replace_job"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobConfig> Coordinator::GetJob() const {
  absl::MutexLock lock(&mu_);
  if (!has_job_) {
    return absl::FailedPreconditionError(
        "the coordinator has no job: start it with --job=FILE");
  }
  return job_;
}

bool Coordinator::JobStarted() const {
  absl::MutexLock lock(&mu_);
  return !job_started_.empty();
}

absl::Status Coordinator::PutMember(const v1::MemberRecord& record) {
  return store_->Put(absl::StrCat(kMemberPrefix, record.member_id()),
                     record.SerializeAsString());
}

absl::Status Coordinator::CheckRegister(const v1::RegisterRequest& request) const {
  if (request.role() != v1::SHARD_SERVER && request.role() != v1::WORKER) {
    return absl::InvalidArgumentError("register: role must be SHARD_SERVER or WORKER");
  }
  if (request.role() == v1::SHARD_SERVER && request.address().empty()) {
    return absl::InvalidArgumentError("register: a shard server must give its address");
  }
  if (!request.address().empty()) RETURN_IF_ERROR(CheckMemberAddress(request.address()));
  if (request.role() == v1::WORKER) {
    const int32_t limit = MaxBarrierCount();
    if (request.rank() < -1 || request.rank() >= limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register: rank ", request.rank(), " is outside [0, ", limit, ")",
          options_.world_size > 0 ? " (the job's world size, --world_size)"
                                  : " (--max_members; --world_size not set)",
          "; -1 for a worker without a rank"));
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CheckShardConfig(const v1::RegisterRequest& request) const {
  if (request.role() != v1::SHARD_SERVER || request.num_slots() == 0) {
    return absl::OkStatus();  // an older shard server: nothing reported
  }
  std::vector<std::string> differences;
  const uint32_t cluster_slots = map_.epoch() > 0 ? map_.num_slots() : options_.num_slots;
  if (request.num_slots() != cluster_slots) {
    differences.push_back(absl::StrCat("it has --num_slots=", request.num_slots(),
                                       ", the cluster has ", cluster_slots));
  }
  if (has_job_) {
    for (std::string& d : config::TableDifferences(job_, request.tables())) {
      differences.push_back(std::move(d));
    }
  }
  if (differences.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "register: refused shard server ", request.address(),
      ", it disagrees with the cluster: ", absl::StrJoin(differences, "; "),
      ". Restart it with the coordinator's --num_slots and the job's tables "
      "(recps-shard --job=<the job file>)"));
}

absl::StatusOr<v1::RegisterResponse> Coordinator::Register(
    const v1::RegisterRequest& request, const Caller& caller) {
  RETURN_IF_ERROR(CheckRegister(request));
  Deferred deferred;
  v1::RegisterResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckShardConfig(request); !s.ok()) {
      LogError(s.message());
      return s;
    }
    const absl::Time now = Now();
    MemberEntry* entry = members_.FindSame(request.role(), request.address(), request.rank());
    if (entry != nullptr && caller.checked() && entry->record.state() == v1::ALIVE &&
        !entry->record.identity().empty() && entry->record.identity() != caller.uri) {
      // A live member is never taken over by another identity (an expired
      // or left one may be: a pod rescheduled with a new certificate).
      return absl::PermissionDeniedError(absl::StrCat(
          "register: ", entry->record.member_id(), " (",
          request.role() == v1::WORKER ? absl::StrCat("rank ", request.rank())
                                       : request.address(),
          ") is alive under ", entry->record.identity(), ", not ", caller.uri));
    }
    if (entry != nullptr && request.role() == v1::SHARD_SERVER) {
      NoteShardRestart(*entry, request, &deferred);
    }
    v1::MemberRecord record;
    if (entry != nullptr) {
      record = entry->record;
    } else {
      if (caller.checked()) RETURN_IF_ERROR(CheckMemberQuota(caller));
      if (members_.size() >= static_cast<size_t>(options_.max_members)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "register: the coordinator keeps ", members_.size(),
            " members, the limit is ", options_.max_members,
            " (--max_members); remove expired ones with `recpsctl members "
            "forget ID`"));
      }
      record = members_.NewRecord(request.role());
    }
    record.set_address(request.address());
    record.set_rank(request.role() == v1::WORKER ? request.rank() : -1);
    record.set_state(v1::ALIVE);
    record.set_registered_unix_ms(ToUnixMs(now));
    record.set_identity(caller.uri);
    if (request.role() == v1::SHARD_SERVER) {
      *record.mutable_capacity() = request.capacity();
      record.set_incarnation(request.incarnation());
    }
    if (request.role() == v1::WORKER && has_job_ && job_started_.empty()) {
      // From now on the job may have trained: it is no longer replaceable.
      std::string started = absl::StrCat(record.member_id(), " (rank ", record.rank(),
                                         ") registered for it at ",
                                         absl::FormatTime(now, absl::UTCTimeZone()));
      RETURN_IF_ERROR(store_->Put(kJobStartedKey, started));
      job_started_ = std::move(started);
    }
    RETURN_IF_ERROR(PutMember(record));
    entry = &members_.Add({record, now, caller.client});
    LogInfo("registered ", record.member_id(), " (", RoleName(record.role()), " at ",
            record.address().empty() ? "-" : record.address(),
            record.role() == v1::WORKER ? absl::StrCat(", rank ", record.rank()) : "",
            ")");
    if (request.role() == v1::SHARD_SERVER) {
      if (map_.epoch() == 0) {
        RETURN_IF_ERROR(MaybeBuildMap(&deferred));
      } else if (ShardMap::FromProto(map_)->IndexOf(record.address()) >= 0) {
        // It may have restarted without its map: give it the current one.
        if (pusher_) {
          deferred.calls.push_back(
              [pusher = pusher_, address = record.address(), map = map_] {
                pusher(address, map);
              });
        }
      } else {
        LogWarning(record.member_id(), " at ", record.address(),
                   " is not in shard map epoch ", map_.epoch(),
                   "; it serves nothing until a rebalance adds it");
      }
    }
    UpdateMemberGauges();
    response.set_member_id(record.member_id());
    response.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
    if (has_job_) *response.mutable_job() = job_;
    response.set_shard_map_epoch(map_.epoch());
  }
  deferred.Run(this);
  // Outside mu_: the orchestrator calls into this coordinator.
  if (request.role() == v1::WORKER && request.rank() >= 0) {
    checkpoints_->WorkerRegistered(request.rank());
  }
  return response;
}

void Coordinator::UpdateMapGauges() {
  if (metrics_ == nullptr) return;
  metrics_->epoch.Set(static_cast<double>(map_.epoch()));
  const absl::StatusOr<ShardMap> map = ShardMap::FromProto(map_);
  metrics_->replication.Set(map.ok() ? map->replication() : 1);
  metrics_->under_replicated_units.Set(
      map.ok() ? static_cast<double>(map->UnderReplicatedUnits()) : 0);
}

int Coordinator::Replication() const {
  if (options_.replication > 0) return options_.replication;
  return has_job_ ? std::max<int>(1, static_cast<int>(job_.replication())) : 1;
}

absl::Status Coordinator::MaybeBuildMap(Deferred* deferred) {
  if (options_.num_shards == 0) return absl::OkStatus();
  std::vector<std::string> servers;
  for (const auto& [id, e] : members_) {
    if (e.record.role() == v1::SHARD_SERVER && e.record.state() == v1::ALIVE) {
      servers.push_back(e.record.address());
    }
  }
  if (static_cast<int>(servers.size()) < options_.num_shards) return absl::OkStatus();
  // Sorted, not in arrival order: the same servers always give the same map.
  std::sort(servers.begin(), servers.end());
  servers.resize(options_.num_shards);
  // No map yet (a failed plan of --plan_spec, replicas that cannot be
  // placed) is not an error of the Register that got here: GetShardMap and
  // GetPlan say why, and the next change of the cluster tries again.
  std::optional<v1::ShardMap> built = plans_.BuildFirstMap(
      servers, members_.CapacitiesOf(servers), has_job_ ? &job_ : nullptr, Replication());
  if (!built.has_value()) return absl::OkStatus();
  const v1::ShardMap map = *std::move(built);
  RETURN_IF_ERROR(CommitMap(map, "", deferred));
  LogInfo("built shard map epoch 1: ", options_.num_slots, " slots over ",
          absl::StrJoin(servers, ", "),
          map.replication() > 1
              ? absl::StrCat("; ", map.replication(), " copies of each row (a primary and ",
                             map.replication() - 1, " backup(s) on other servers)")
              : std::string());
  return absl::OkStatus();
}

absl::Status Coordinator::CommitMap(const v1::ShardMap& map, const std::string& except,
                                    Deferred* deferred) {
  RETURN_IF_ERROR(store_->Put(kShardMapKey, map.SerializeAsString()));
  map_ = map;
  UpdateMapGauges();
  if (pusher_) {
    for (const std::string& address : map.servers()) {
      if (address == except) continue;
      deferred->calls.push_back([pusher = pusher_, address, map] { pusher(address, map); });
    }
  }
  deferred->published.push_back(map);
  return absl::OkStatus();
}

absl::Status Coordinator::CheckMemberQuota(const Caller& caller) {
  const std::vector<std::string> held_ids = members_.OfClient(caller.client);
  int held = static_cast<int>(held_ids.size());
  if (held < options_.max_members_per_client) return absl::OkStatus();
  for (const std::string& id : held_ids) {  // its own expired and left ones go
    if (members_.Find(id)->record.state() == v1::ALIVE) continue;
    RETURN_IF_ERROR(store_->Delete(absl::StrCat(kMemberPrefix, id)));
    members_.Erase(id);
    --held;
  }
  if (held < options_.max_members_per_client) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "register: ", caller.client, " holds ", held, " live members, the limit per client is ",
      options_.max_members_per_client, " (--max_members_per_client)"));
}

absl::Status Coordinator::CheckOwner(const MemberEntry& entry, const Caller& caller,
                                     absl::string_view what) const {
  if (!caller.checked() || entry.record.identity().empty() ||
      entry.record.identity() == caller.uri) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, ": ", entry.record.member_id(), " was registered by ", entry.record.identity(),
      ", not ", caller.uri));
}

absl::Status Coordinator::CheckClaim(const Caller& caller, int32_t rank,
                                     const std::string& member_id,
                                     absl::string_view what) const {
  if (!caller.checked()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (!member_id.empty()) {
    if (const MemberEntry* e = members_.Find(member_id); e != nullptr) {
      RETURN_IF_ERROR(CheckOwner(*e, caller, what));
    }
  }
  const MemberEntry* holder = rank >= 0 ? members_.FindSame(v1::WORKER, "", rank) : nullptr;
  if (holder != nullptr && holder->record.state() == v1::ALIVE &&
      !holder->record.identity().empty() && holder->record.identity() != caller.uri) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, ": rank ", rank, " is registered (", holder->record.member_id(), ") by ",
        holder->record.identity(), ", not ", caller.uri));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(
    const v1::HeartbeatRequest& request, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  MemberEntry* found = members_.Find(request.member_id());
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("heartbeat: no member '",
                                            request.member_id(), "'; register first"));
  }
  RETURN_IF_ERROR(CheckOwner(*found, caller, "heartbeat"));
  if (found->record.state() == v1::EXPIRED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "heartbeat: the lease of ", request.member_id(), " ran out (no heartbeat for ",
        absl::FormatDuration(options_.lease), "); register again"));
  }
  if (found->record.state() == v1::LEFT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "heartbeat: ", request.member_id(), " left the cluster; register again"));
  }
  found->last_heartbeat = Now();
  NoteLineage(*found, request);
  v1::HeartbeatResponse response;
  response.set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  response.set_shard_map_epoch(map_.epoch());
  response.set_checkpoint_request_id(checkpoints_->request_id());
  return response;
}

absl::Status Coordinator::Leave(const v1::LeaveRequest& request, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  MemberEntry* found = members_.Find(request.member_id());
  if (found == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("leave: no member '", request.member_id(), "'"));
  }
  RETURN_IF_ERROR(CheckOwner(*found, caller, "leave"));
  if (found->record.state() == v1::LEFT) return absl::OkStatus();
  v1::MemberRecord record = found->record;
  record.set_state(v1::LEFT);
  RETURN_IF_ERROR(PutMember(record));
  found->record = record;
  UpdateMemberGauges();
  LogInfo(request.member_id(), " (", RoleName(record.role()),
          record.role() == v1::WORKER ? absl::StrCat(" rank ", record.rank())
                                      : absl::StrCat(" at ", record.address()),
          ") left the cluster");
  if (record.role() == v1::WORKER) {
    bool any_worker_left_behind = false;
    for (const auto& [id, e] : members_) {
      any_worker_left_behind = any_worker_left_behind ||
                               (e.record.role() == v1::WORKER && e.record.state() != v1::LEFT);
    }
    // Every worker left cleanly: the run is over, and its rendezvous keys
    // (addresses, NCCL ids) must not outlive it in the state dir.
    if (!any_worker_left_behind && !kv_.empty()) {
      LogInfo("every worker left: dropping the run's ", kv_.size(), " key-value entries");
      ClearKv();
    }
  }
  return absl::OkStatus();
}

v1::Member Coordinator::ToMember(const MemberEntry& e) const {
  v1::Member m;
  m.set_member_id(e.record.member_id());
  m.set_role(e.record.role());
  m.set_address(e.record.address());
  m.set_rank(e.record.rank());
  m.set_state(e.record.state());
  m.set_registered_unix_ms(e.record.registered_unix_ms());
  m.set_last_heartbeat_unix_ms(ToUnixMs(e.last_heartbeat));
  return m;
}

absl::StatusOr<v1::Member> Coordinator::ForgetMember(const std::string& member_id) {
  absl::MutexLock lock(&mu_);
  MemberEntry* found = members_.Find(member_id);
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("forget: no member '", member_id.substr(0, 64),
                                            "'; `recpsctl status` lists them"));
  }
  const v1::MemberRecord& r = found->record;
  if (r.state() == v1::ALIVE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "forget: ", member_id, " is alive (last heartbeat ",
        absl::FormatDuration(absl::Trunc(Now() - found->last_heartbeat,
                                         absl::Milliseconds(1))),
        " ago, lease ", absl::FormatDuration(options_.lease),
        "); only an expired or left member can be forgotten: stop it first"));
  }
  RETURN_IF_ERROR(store_->Delete(absl::StrCat(kMemberPrefix, member_id)));
  v1::Member forgotten = ToMember(*found);
  members_.Erase(member_id);
  UpdateMemberGauges();
  LogInfo("forgot ", member_id, " (", RoleName(forgotten.role()),
          forgotten.role() == v1::WORKER ? absl::StrCat(" rank ", forgotten.rank())
                                         : absl::StrCat(" at ", forgotten.address()),
          ", ", forgotten.state() == v1::EXPIRED ? "expired" : "left", ")");
  return forgotten;
}

void Coordinator::RecordMapPush(const std::string& address, uint64_t epoch,
                                const absl::Status& outcome) {
  absl::MutexLock lock(&mu_);
  if (outcome.ok()) {
    auto it = push_refusals_.find(address);
    if (it != push_refusals_.end() && it->second.epoch() <= epoch) push_refusals_.erase(it);
    return;
  }
  if (metrics_ != nullptr) metrics_->push_refusals.Increment();
  // Only servers of a map are pushed to, so this stays small.
  v1::MapPushRefusal& r = push_refusals_[address];
  r.set_address(address);
  r.set_epoch(epoch);
  r.set_message(std::string(outcome.message().substr(0, 1024)));
  r.set_unix_ms(ToUnixMs(Now()));
}

v1::ListMembersResponse Coordinator::ListMembers() const {
  absl::MutexLock lock(&mu_);
  std::vector<const MemberEntry*> sorted;
  for (const auto& [id, e] : members_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const MemberEntry* a, const MemberEntry* b) {
    return a->record.sequence() < b->record.sequence();
  });
  v1::ListMembersResponse response;
  for (const MemberEntry* e : sorted) *response.add_members() = ToMember(*e);
  response.set_shard_map_epoch(map_.epoch());
  response.set_expected_shard_servers(options_.num_shards);
  response.set_lease_expirations(lease_expirations_);
  for (const auto& [address, refusal] : push_refusals_) {
    *response.add_map_push_refusals() = refusal;
  }
  return response;
}

absl::StatusOr<v1::ShardMap> Coordinator::GetShardMap() const {
  absl::MutexLock lock(&mu_);
  if (map_.epoch() == 0) {
    int alive = 0;
    for (const auto& [id, e] : members_) {
      alive += e.record.role() == v1::SHARD_SERVER && e.record.state() == v1::ALIVE;
    }
    if (!plans_.error().empty()) {
      return absl::UnavailableError(absl::StrCat("no shard map yet: ", plans_.error()));
    }
    return absl::UnavailableError(absl::StrCat(
        "no shard map yet: ", alive, " of ", options_.num_shards,
        " shard servers registered", options_.num_shards == 0
                                         ? " (the coordinator runs without --num_shards)"
                                         : ""));
  }
  return map_;
}

absl::Status Coordinator::SetShardMap(const v1::ShardMap& map) {
  ASSIGN_OR_RETURN(const ShardMap parsed, ShardMap::FromProto(map));
  if (parsed.num_slots() != options_.num_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map has ", parsed.num_slots(), " slots; this cluster has ",
        options_.num_slots));
  }
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    if (map_.epoch() == 0) {
      return absl::FailedPreconditionError(
          "no shard map yet: the first one is built when enough shard "
          "servers registered");
    }
    if (map.epoch() <= map_.epoch()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard map epoch ", map.epoch(),
                       " is not newer than the current ", map_.epoch()));
    }
    if (map.epoch() > map_.epoch() + kMaxShardMapEpochStep) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), " jumps more than ", kMaxShardMapEpochStep,
          " past the current ", map_.epoch(), "; epochs grow by one per map change"));
    }
    RETURN_IF_ERROR(CommitMap(map, "", &deferred));
  }
  LogInfo("shard map epoch ", map.epoch(), " set over ",
          absl::StrJoin(parsed.servers(), ", "));
  deferred.Run(this);
  return absl::OkStatus();
}

Coordinator::MapChangeGuard::MapChangeGuard(Coordinator* c, Kind kind)
    : c_(c), kind_(kind) {
  absl::MutexLock lock(&c_->gate_mu_);
  const int other = kind == kHandOver ? kSnapshot : kHandOver;
  auto clear = [this, other] {
    c_->gate_mu_.AssertHeld();
    return c_->gate_holders_[other] == 0;
  };
  c_->gate_mu_.Await(absl::Condition(&clear));
  ++c_->gate_holders_[kind];
}

Coordinator::MapChangeGuard::~MapChangeGuard() {
  absl::MutexLock lock(&c_->gate_mu_);
  --c_->gate_holders_[kind_];
}

uint64_t Coordinator::shard_map_epoch() const {
  absl::MutexLock lock(&mu_);
  return map_.epoch();
}

int64_t Coordinator::pending_kv_waits() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(kv_waiters_.size());
}

int64_t Coordinator::Watch(uint64_t after_epoch, WatchFn fn) {
  // watch_mu_ before reading the map: a Publish either sees this watcher or
  // happened before, in which case the map read here is the new one.
  absl::MutexLock lock(&watch_mu_);
  v1::ShardMap current;
  {
    absl::MutexLock state_lock(&mu_);
    current = map_;
  }
  if (current.epoch() > after_epoch) fn(current);
  const int64_t id = next_watch_id_++;
  watchers_[id] = std::move(fn);
  return id;
}

void Coordinator::Unwatch(int64_t id) {
  absl::MutexLock lock(&watch_mu_);
  watchers_.erase(id);
}

void Coordinator::Publish(const v1::ShardMap& map) {
  absl::MutexLock lock(&watch_mu_);
  for (auto& [id, fn] : watchers_) fn(map);
}

void Coordinator::UpdateMemberGauges() {
  if (metrics_ == nullptr) return;
  for (v1::MemberRole role : {v1::SHARD_SERVER, v1::WORKER}) {
    for (v1::MemberState state : {v1::ALIVE, v1::EXPIRED, v1::LEFT}) {
      int n = 0;
      for (const auto& [id, e] : members_) {
        n += e.record.role() == role && e.record.state() == state;
      }
      metrics_->members
          .Add({{"role", RoleName(role)},
                {"state", state == v1::ALIVE     ? "alive"
                          : state == v1::EXPIRED ? "expired"
                                                 : "left"}})
          .Set(n);
    }
  }
}

void Coordinator::Tick() {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    if (metrics_ != nullptr) {
      metrics_->kv_pending_waits.Set(static_cast<double>(kv_waiters_.size()));
      size_t parked = 0;
      for (const auto& [name, barrier] : barriers_) parked += barrier.waiters.size();
      metrics_->barrier_pending_waits.Set(static_cast<double>(parked));
    }
    const absl::Time now = Now();
    // A coordinator that did not tick for a while (options_.stall) cannot
    // tell the members' silence from its own: every live member gets a
    // fresh lease, as after a restart, rather than a failover of servers
    // that are alive.
    const absl::Time real = absl::Now();
    const absl::Duration stall =
        options_.stall > absl::ZeroDuration() ? options_.stall : options_.lease / 2;
    if (last_tick_real_ != absl::InfinitePast() && real - last_tick_real_ > stall) {
      LogWarning("the coordinator did not check leases for ",
                 absl::FormatDuration(real - last_tick_real_), " (stalled?): every live "
                 "member's lease starts again");
      for (auto& [id, e] : members_) e.last_heartbeat = std::max(e.last_heartbeat, now);
    }
    last_tick_real_ = real;
    bool changed = false;
    for (auto& [id, e] : members_) {
      if (e.record.state() != v1::ALIVE || now - e.last_heartbeat <= options_.lease) {
        continue;
      }
      v1::MemberRecord record = e.record;
      record.set_state(v1::EXPIRED);
      // The in-memory state changes even when the write fails: the member
      // is gone either way, and a restart hands out fresh leases.
      if (absl::Status s = PutMember(record); !s.ok()) {
        LogError("cannot store the expiry of ", id, ": ", s.message());
      }
      e.record = record;
      ++lease_expirations_;
      changed = true;
      if (metrics_ != nullptr) {
        metrics_->expirations.Add({{"role", RoleName(record.role())}}).Increment();
      }
      LogWarning("lease of ", id, " (", RoleName(record.role()),
                 record.role() == v1::WORKER ? absl::StrCat(" rank ", record.rank())
                                             : absl::StrCat(" at ", record.address()),
                 ") ran out: no heartbeat for ",
                 absl::FormatDuration(now - e.last_heartbeat), "; marked expired");
      if (record.role() == v1::SHARD_SERVER) FailOver(record.address(), e.last_heartbeat, &deferred);
    }
    if (changed) UpdateMemberGauges();
    ExpireKvWaiters(now, &deferred);
    ExpireBarrierWaiters(now, &deferred);
  }
  deferred.Run(this);
  checkpoints_->Tick();
}

}  // namespace recps::server

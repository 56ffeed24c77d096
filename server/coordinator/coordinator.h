// The coordinator's domain logic, without gRPC: members and their leases,
// the shard map (built once --num_shards servers registered, then pushed and
// watched), the job config, and a key-value store with waits and barriers
// for rendezvous. State that must survive a restart (members, map, job, KV
// entries) is written through to a CoordinatorStore before a call returns;
// leases, waits and barriers live in memory.
//
// Time comes from an injectable clock and nothing happens on its own: the
// owner calls Tick() periodically (a timer thread in production, the test
// after moving a fake clock), which expires leases and times out waits.
//
// Thread-safe. Callbacks (`done`, watchers, the map pusher) never run under
// the coordinator's state lock, so they may call back into it.
#ifndef RECPS_SERVER_COORDINATOR_COORDINATOR_H_
#define RECPS_SERVER_COORDINATOR_COORDINATOR_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "recps/v1/coordinator.pb.h"
#include "server/coordinator/checkpoint_orchestrator.h"
#include "server/coordinator/coordinator_plan.h"
#include "server/coordinator/coordinator_store.h"
#include "server/coordinator/member_table.h"
#include "server/coordinator/move_orchestrator.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace recps::server {

struct CoordinatorMetrics;

struct CoordinatorOptions {
  // Shard servers to wait for before building the first shard map (epoch 1
  // over their addresses, sorted). 0: never build one automatically.
  int num_shards = 0;
  // Slots of the cluster (fixed for its life); a stored map keeps its own.
  uint32_t num_slots = 4096;
  // Copies of each row (--replication); 0: the job's `replication` (1
  // without a job).
  int replication = 0;
  // A member that sends no heartbeat for this long is marked expired.
  absl::Duration lease = absl::Seconds(10);
  // Real time (absl::Now, not `clock`) between two Ticks past which the
  // coordinator takes itself for stalled (stopped, starved, a paused VM):
  // it cannot tell the members' silence from its own, so every live member
  // gets a fresh lease rather than a failover. 0: half the lease.
  absl::Duration stall = absl::ZeroDuration();
  // Waits and barriers that give no timeout use this one.
  absl::Duration default_wait = absl::Minutes(5);
  // Workers of the job (--world_size); 0: not known. Bounds barrier counts
  // and worker ranks; when 0, max_members bounds them instead.
  int world_size = 0;
  // Members the coordinator keeps (alive, expired and left): bounds its
  // memory and the per-call work over the member table (--max_members).
  int max_members = 1024;
  // Key-value store limits (--max_kv_key_bytes, --max_kv_value_bytes,
  // --max_kv_keys, --max_kv_bytes): a key's and a value's size, the keys
  // of the job, and the bytes of its keys and values together.
  int64_t max_kv_key_bytes = 256;
  int64_t max_kv_value_bytes = 1 << 20;
  int64_t max_kv_keys = 10000;
  int64_t max_kv_bytes = int64_t{256} << 20;
  // Quotas of one client (Caller::client) inside those limits, so that one
  // identity cannot lock the job out (--max_members_per_client,
  // --max_waits_per_client, --max_kv_keys_per_client,
  // --max_kv_bytes_per_client): members it registered, waits and barrier
  // arrivals it has pending, KV keys it created and their bytes.
  int max_members_per_client = 64;
  int max_waits_per_client = 64;
  int64_t max_kv_keys_per_client = 1000;
  int64_t max_kv_bytes_per_client = int64_t{16} << 20;
  // The longest wait or barrier timeout a caller may ask for; longer ones
  // are cut to it (--max_wait).
  absl::Duration max_wait = absl::Hours(1);
  // Time source; default absl::Now. Tests inject a fake.
  std::function<absl::Time()> clock;
  // kPlanned: the first map comes from the sharding planner (job tables +
  // plan_spec's topology and hints, or without one what the shard servers
  // reported of themselves) instead of uniform slots; the plan is stored
  // and served by GetPlan. See docs/planner.md.
  Sharding sharding = Sharding::kPlanned;
  std::optional<v1::PlanSpec> plan_spec;
  // Checkpoints: --restore, timeouts, the shard servers' RPCs
  // (checkpoint_orchestrator.h). The checkpoint directory and policy come
  // from the job's training.checkpoint.
  CheckpointOrchestratorOptions checkpoint;
  // Rebalancing: slot moves between shard servers (move_orchestrator.h).
  MoveOrchestratorOptions moves;
};

// Who makes a call, for the claims the coordinator checks against the
// caller's certificate (docs/security.md): `uri` is its certificate's URI,
// `client` its per-client key ("<uri> at <host>", what quotas count). Both
// empty: nothing is checked (plaintext, an admin, in-process callers).
struct Caller {
  std::string uri;
  std::string client;
  // Nonzero: the id under which a wait of this call is parked, so that
  // CancelWait(wait_id) releases it when the caller goes away.
  int64_t wait_id = 0;
  bool checked() const { return !uri.empty(); }
};

// OK when `address` is host:port with port 1..65535 and host a DNS name,
// an IPv4 literal or a bracketed IPv6 literal; else INVALID_ARGUMENT saying
// what is wrong.
absl::Status CheckMemberAddress(const std::string& address);

class Coordinator {
 public:
  // Delivers `map` to the shard server at `address` (ShardAdmin.SetShardMap
  // in production). Must not block: called from RPC threads.
  using MapPusher =
      std::function<void(const std::string& address, const v1::ShardMap& map)>;
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  using ValueDone = absl::AnyInvocable<void(absl::StatusOr<std::string>) &&>;
  using WatchFn = std::function<void(const v1::ShardMap&)>;

  // Loads the state kept in `store` (DATA_LOSS when a record does not
  // parse). `registry` (may be null) receives the coordinator's metrics.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      std::unique_ptr<CoordinatorStore> store, CoordinatorOptions options,
      prometheus::Registry* registry);
  ~Coordinator();

  // Set before serving; null or unset: maps are only watched, not pushed.
  void SetMapPusher(MapPusher pusher);

  // Stores the job after config::ValidateJobConfig (INVALID_ARGUMENT naming
  // the field). When a different job is stored already: with `replace` and
  // no training progress yet (no worker ever registered for the stored
  // job) the job is replaced and the old job's KV entries dropped;
  // otherwise FAILED_PRECONDITION saying whether --replace_job would do or
  // why not.
  absl::Status SetJob(const v1::JobConfig& job, bool replace = false);
  // Why the stored job fails config::ValidateJobConfig (stored by an older
  // coordinator); OK when it passes or there is none.
  absl::Status StoredJobStatus() const;
  // FAILED_PRECONDITION when there is no job.
  absl::StatusOr<v1::JobConfig> GetJob() const;
  // Whether a worker ever registered for the stored job (training may have
  // progressed), as kept in the state across restarts.
  bool JobStarted() const;

  // Checkpoint cuts, requests, the listing and --restore.
  CheckpointOrchestrator& checkpoints() { return *checkpoints_; }
  // Hand-overs of slot moves and checkpoint snapshots exclude each other,
  // so a checkpoint never sees a moving slot on both servers or on neither.
  // While one holds a MapChangeGuard of its kind, the other kind waits.
  class MapChangeGuard {
   public:
    enum Kind { kHandOver, kSnapshot };
    MapChangeGuard(Coordinator* c, Kind kind);
    ~MapChangeGuard();
    MapChangeGuard(const MapChangeGuard&) = delete;
    MapChangeGuard& operator=(const MapChangeGuard&) = delete;

   private:
    Coordinator* const c_;
    const Kind kind_;
  };
  // Rebalance plans and slot moves; call moves().Start() before serving.
  MoveOrchestrator& moves() { return *moves_; }

  // With a checked caller: PERMISSION_DENIED when the member it would be
  // (the rank, the shard address) is ALIVE under another identity;
  // RESOURCE_EXHAUSTED past max_members_per_client (after forgetting the
  // client's own expired and left members). The caller's role must match
  // the request's (checked by the service, which knows roles).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                const Caller& caller = {});
  // PERMISSION_DENIED when a checked caller is not the member's identity.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request, const Caller& caller = {});
  // Marks the member LEFT (a clean exit); its lease no longer runs. Once
  // every worker has left, the job run is over and its KV entries go.
  // PERMISSION_DENIED when a checked caller is not the member's identity.
  absl::Status Leave(const v1::LeaveRequest& request, const Caller& caller = {});
  // A checked caller may act for `rank` (>= 0) only when no live worker of
  // that rank is registered under another identity, and for `member_id`
  // (non-empty) only when it registered that member: PERMISSION_DENIED
  // naming both otherwise. For barriers, cuts and resume state.
  absl::Status CheckClaim(const Caller& caller, int32_t rank,
                          const std::string& member_id, absl::string_view what) const;
  // Removes an EXPIRED or LEFT member (memory and state) and returns it as
  // it was listed. FAILED_PRECONDITION for an ALIVE one, NOT_FOUND for an
  // unknown id.
  absl::StatusOr<v1::Member> ForgetMember(const std::string& member_id);
  v1::ListMembersResponse ListMembers() const;
  // Of each shard server at `addresses` (re-replication's candidates):
  // whether it holds a lease now (registered, ALIVE and heard from within
  // the lease, even before a Tick expires it), and the zone it reported at
  // registration ("" when unknown). coordinator_failover.cc.
  struct ServerLiveness {
    std::vector<bool> alive;
    std::vector<std::string> zones;
  };
  ServerLiveness LivenessOf(const std::vector<std::string>& addresses) const;
  // The units this coordinator promoted at failovers, as (owner address,
  // table or "" for a slot of the map's slot owners, slot), that still step
  // on the lost primary's clock on their owner: no new backup can follow
  // them until the owner's heartbeat says that lineage is merged. In
  // memory: after a restart the owners' refusals say it.
  using PromotedUnit = std::tuple<std::string, std::string, uint32_t>;
  std::set<PromotedUnit> PromotedUnits() const;
  // The newest map epoch at which shard server `address` said no lost
  // primary's clock steps units it owns (0: none, or not a member).
  uint64_t LineageFreeEpoch(const std::string& address) const;

  // UNAVAILABLE (naming how many servers are still missing) before the
  // first map is built.
  absl::StatusOr<v1::ShardMap> GetShardMap() const;
  // Replaces the map with a newer one (an operator's or a rebalance's):
  // stores it, pushes it to the servers it lists and publishes it to
  // watchers. INVALID_ARGUMENT when it is malformed or has another slot
  // count; FAILED_PRECONDITION before the first map or when its epoch is
  // not newer.
  absl::Status SetShardMap(const v1::ShardMap& map);
  uint64_t shard_map_epoch() const;
  // KvGet calls parked until their key is set (for tests and metrics).
  int64_t pending_kv_waits() const;

  // The stored sharding plan. NOT_FOUND when the coordinator does not plan
  // (no plan_spec) and none is stored; UNAVAILABLE, with the planner's
  // error if it failed, before the first map is built.
  absl::StatusOr<v1::ShardingPlan> GetPlan() const;

  // Calls `fn` with every map newer than `after_epoch`: the current one (if
  // newer) before Watch returns, then each new epoch. Calls may come from
  // any thread and, rarely, out of order: receivers drop older epochs.
  // After Unwatch(id) returns, `fn` is not running and never runs again.
  int64_t Watch(uint64_t after_epoch, WatchFn fn);
  void Unwatch(int64_t id);

  // INVALID_ARGUMENT for an empty key or one or a value above its size
  // limit; RESOURCE_EXHAUSTED when a new key would pass the key count or
  // byte limit. Keys belong to the current job: a replaced job's are gone.
  // A checked caller's new keys also count against its own quotas.
  absl::Status KvSet(const std::string& key, std::string value,
                     const Caller& caller = {});
  // done(value) once `key` exists; NOT_FOUND at once when wait <= 0 and it
  // is absent; DEADLINE_EXCEEDED when the wait runs out. Waits are cut to
  // max_wait and count against the caller's max_waits_per_client.
  void KvGet(const std::string& key, absl::Duration wait, ValueDone done,
             const Caller& caller = {});
  // done(OK) once every key exists; DEADLINE_EXCEEDED naming the missing.
  void KvWait(std::vector<std::string> keys, absl::Duration timeout, Done done,
              const Caller& caller = {});
  // done(OK) once request.count distinct arrivals met; DEADLINE_EXCEEDED
  // naming the missing ranks or workers when the timeout runs out.
  void Barrier(const v1::BarrierRequest& request, Done done,
               const Caller& caller = {});
  // An id for Caller::wait_id (never 0).
  int64_t NewWaitId() { return next_wait_id_.fetch_add(1) + 1; }
  // Ends the wait or barrier arrival parked under `wait_id` with CANCELLED
  // (its caller went away): its slot, quota and arrival are released at
  // once. Nothing when it already ended.
  void CancelWait(int64_t wait_id);

  // What became of a map push to `address` (from the pusher): OK clears a
  // recorded refusal; an error records it for ListMembers and counts it in
  // recps_coordinator_shard_map_push_refusals_total.
  void RecordMapPush(const std::string& address, uint64_t epoch,
                     const absl::Status& outcome);

  // Expires leases that ran out and fails waits whose deadline passed.
  void Tick();
  // Fails every pending wait and barrier with `status` (at shutdown).
  void CancelWaits(const absl::Status& status);

 private:
  struct KvWaiter {
    std::vector<std::string> keys;
    absl::Time deadline;
    ValueDone done;  // gets the value of keys.back()
    std::string client;
    int64_t wait_id = 0;
  };
  struct BarrierWaiter {
    std::string who;  // "rank 3" or "member worker-1"
    int32_t rank = -1;
    absl::Time deadline;
    Done done;
    std::string client;
    int64_t wait_id = 0;
  };
  // What one client holds, for its quotas.
  struct ClientUsage {
    int64_t waits = 0;
    int64_t kv_keys = 0;
    int64_t kv_bytes = 0;
  };
  struct BarrierState {
    int32_t count = 0;
    // Earliest waiter deadline, so a tick skips the barrier in O(1).
    absl::Time earliest_deadline = absl::InfiniteFuture();
    std::map<std::string, int32_t> arrived;  // who -> rank
    std::vector<BarrierWaiter> waiters;
  };
  // Work to run after the state lock is released.
  struct Deferred {
    std::vector<absl::AnyInvocable<void() &&>> calls;
    std::vector<v1::ShardMap> published;
    void Run(Coordinator* c);
  };

  Coordinator(std::unique_ptr<CoordinatorStore> store, CoordinatorOptions options,
              prometheus::Registry* registry);
  absl::Status Load();
  absl::Time Now() const { return options_.clock(); }
  absl::Status PutMember(const v1::MemberRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when caller.client holds max_members_per_client
  // members, after forgetting its own expired and left ones.
  absl::Status CheckMemberQuota(const Caller& caller) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PERMISSION_DENIED when a checked caller is not `entry`'s identity.
  absl::Status CheckOwner(const MemberEntry& entry, const Caller& caller,
                          absl::string_view what) const;
  // INVALID_ARGUMENT naming the field and the limit when a Register
  // request is malformed.
  absl::Status CheckRegister(const v1::RegisterRequest& request) const;
  // FAILED_PRECONDITION naming every difference when a shard server's
  // num_slots or tables differ from the cluster's and the job's.
  absl::Status CheckShardConfig(const v1::RegisterRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Member ToMember(const MemberEntry& e) const;
  // Builds the first map once enough shard servers are alive.
  // The map's gauges: its epoch, copies and under-replicated units.
  void UpdateMapGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies of each row: --replication, else the job's, else 1.
  int Replication() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `map` the current one: stored, its gauges, pushed to its servers
  // but `except` (a lost one; "" for none) and published, once `deferred`
  // runs. The store's error, with nothing changed.
  absl::Status CommitMap(const v1::ShardMap& map, const std::string& except,
                         Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Failover (docs/replication.md): shard server `address`, whose lease ran
  // out (last heartbeat at `last_heartbeat`), is replaced in a new map
  // epoch by the backups of what it owned (PromoteBackups), pushed to the
  // servers and published. Without a backup left for one of its units the
  // map stays: the job falls back to its checkpoint restart.
  // A shard server registering with another incarnation than the one
  // registered at its address (restarted within its lease): logs it and
  // fails the old process over (coordinator_failover.cc).
  void NoteShardRestart(const MemberEntry& entry, const v1::RegisterRequest& request,
                        Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailOver(const std::string& address, absl::Time last_heartbeat, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A shard server's heartbeat says whether lost primaries' clocks still
  // step units it owns (HeartbeatRequest.lost_primary_clocks).
  void NoteLineage(MemberEntry& entry, const v1::HeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With the epoch of the map that promoted them.
  std::map<PromotedUnit, uint64_t> promoted_units_ ABSL_GUARDED_BY(mu_);
  absl::Status MaybeBuildMap(Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where the current job's KV entries are stored: "kv/<len>:<job name>/".
  std::string KvScope() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loads the current job's KV entries and deletes any other job's.
  absl::Status LoadKv() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT when `key` is empty or too long.
  absl::Status CheckKvKey(absl::string_view what, const std::string& key) const;
  absl::Status TooManyWaiters(absl::string_view what) const;
  // RESOURCE_EXHAUSTED when `client` has max_waits_per_client waits
  // pending; else counts one more. "" is never limited.
  absl::Status TakeWaitSlot(const std::string& client, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWaitSlot(const std::string& client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration CapWait(absl::Duration wait) const {
    return std::min(wait, options_.max_wait);
  }
  // Drops the job's KV entries (memory and state): the run is over.
  void ClearKv() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateMemberGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(const v1::ShardMap& map);
  void CompleteKvWaiters(Deferred* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The largest barrier count (and worker rank + 1) accepted: the world
  // size when known, else max_members.
  int32_t MaxBarrierCount() const;
  std::string MissingFromBarrier(const std::string& name,
                                 const BarrierState& barrier) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireKvWaiters(absl::Time now, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireBarrierWaiters(absl::Time now, Deferred* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<CoordinatorStore> store_;
  CoordinatorOptions options_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  // Created last, destroyed first (it calls into the coordinator).
  std::unique_ptr<CheckpointOrchestrator> checkpoints_;
  std::unique_ptr<MoveOrchestrator> moves_;

  mutable absl::Mutex mu_;
  // Ordered by MemberRecord.sequence when listed.
  MemberTable members_ ABSL_GUARDED_BY(mu_);
  int64_t lease_expirations_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_tick_real_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  v1::ShardMap map_ ABSL_GUARDED_BY(mu_);  // epoch 0: none yet
  bool has_job_ ABSL_GUARDED_BY(mu_) = false;
  // Who first registered as a worker for the job, and when (stored as
  // "job_started"); empty: no training progress yet, so the job may be
  // replaced.
  std::string job_started_ ABSL_GUARDED_BY(mu_);
  v1::JobConfig job_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  int64_t kv_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // keys and values in kv_
  // Who created each key (Caller::client; absent: unchecked or loaded).
  absl::flat_hash_map<std::string, std::string> kv_owner_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ClientUsage> usage_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> next_wait_id_{0};
  std::vector<KvWaiter> kv_waiters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
  MapPusher pusher_ ABSL_GUARDED_BY(mu_);
  // The plan the map was built from, and why the last planning failed.
  CoordinatorPlans plans_ ABSL_GUARDED_BY(mu_);
  // The latest refused push per server address (only servers of a map).
  std::map<std::string, v1::MapPushRefusal> push_refusals_ ABSL_GUARDED_BY(mu_);

  // MapChangeGuard holders of each kind.
  absl::Mutex gate_mu_;
  int gate_holders_[2] ABSL_GUARDED_BY(gate_mu_) = {0, 0};

  // Separate from mu_ so watchers run outside it, and Unwatch can wait for
  // a delivery in progress.
  absl::Mutex watch_mu_;
  std::map<int64_t, WatchFn> watchers_ ABSL_GUARDED_BY(watch_mu_);
  int64_t next_watch_id_ ABSL_GUARDED_BY(watch_mu_) = 1;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_COORDINATOR_H_

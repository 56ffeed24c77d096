// The coordinator's use of the sharding planner: plan the first shard map
// from the job's tables and the plan spec, keep the plan in the
// coordinator's state, serve it, and say why planning failed.
#ifndef RECPS_SERVER_COORDINATOR_COORDINATOR_PLAN_H_
#define RECPS_SERVER_COORDINATOR_COORDINATOR_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recps/v1/job.pb.h"
#include "recps/v1/plan.pb.h"
#include "recps/v1/shard_map.pb.h"
#include "server/coordinator/coordinator_store.h"

namespace recps::server {

// How epoch 1 places the tables (recps-coordinator --sharding).
enum class Sharding {
  // The sharding planner: with --plan_spec from it, else from what the
  // shard servers reported at registration (falling back to kEven when
  // that plans nothing).
  kPlanned,
  // Every table row-wise over every server, slots in equal blocks.
  kEven,
};
// "planned" or "even"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Sharding> ParseSharding(const std::string& name);

// Not thread-safe: the coordinator calls it under its own lock.
class CoordinatorPlans {
 public:
  // `store` outlives this object. `spec`: --plan_spec (kPlanned only);
  // `num_workers`: the job's workers (0: unknown, 1 assumed).
  CoordinatorPlans(CoordinatorStore* store, Sharding sharding,
                   std::optional<v1::PlanSpec> spec, uint32_t num_slots, int num_workers)
      : store_(store),
        sharding_(sharding),
        spec_(std::move(spec)),
        num_slots_(num_slots),
        num_workers_(num_workers) {}

  bool enabled() const { return sharding_ == Sharding::kPlanned; }
  // Whether a failed plan leaves the cluster without a map (a --plan_spec
  // the operator wrote) rather than spreading slots evenly.
  bool failure_blocks() const { return spec_.has_value(); }
  // Reads the stored plan (none stored: OK); DATA_LOSS when malformed.
  absl::Status Load();
  // The planned map (epoch 1) over `servers` (sorted addresses) for `job`;
  // `reported[i]` is what servers[i] reported of itself (used without a
  // --plan_spec). Stores the plan. FAILED_PRECONDITION without a job (`job`
  // null) or, without a spec, when a server reported no memory.
  absl::StatusOr<v1::ShardMap> Build(const std::vector<std::string>& servers,
                                     const std::vector<v1::ServerSpec>& reported,
                                     const v1::JobConfig* job);
  // Epoch 1 over `servers` (sorted; `reported[i]` is what servers[i]
  // reported at registration): planned (Build), or the even spread when
  // planning is off or fell back, then `replication - 1` backups for every
  // unit, on other servers of other zones (common/wire/replica_placement.h).
  // nullopt, with error() saying why, when there is no map to build: a
  // --plan_spec that does not fit, replicas the servers or zones cannot hold.
  std::optional<v1::ShardMap> BuildFirstMap(const std::vector<std::string>& servers,
                                            const std::vector<v1::ServerSpec>& reported,
                                            const v1::JobConfig* job, int replication);
  // Records why planning failed (GetShardMap and Get report it).
  void SetError(std::string error) { error_ = std::move(error); }
  const std::string& error() const { return error_; }
  // Records (and logs) that the planner found nothing for the reported
  // servers and the map spreads slots evenly (Get says so).
  void SetFellBack(std::string why);
  // The plan the map was built from; NOT_FOUND when planning is off (or
  // fell back) and none is stored, saying why; UNAVAILABLE, with the
  // planner's error, when it failed or has not run yet.
  absl::StatusOr<v1::ShardingPlan> Get() const;

 private:
  // The spec without --plan_spec: the reported servers, the job's workers.
  absl::StatusOr<v1::PlanSpec> SpecFromReports(const std::vector<std::string>& servers,
                                               const std::vector<v1::ServerSpec>& reported) const;

  CoordinatorStore* const store_;
  const Sharding sharding_;
  const std::optional<v1::PlanSpec> spec_;
  const uint32_t num_slots_;
  const int num_workers_;
  v1::ShardingPlan plan_;  // plan_id 0: none
  std::string error_;
  std::string fell_back_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_COORDINATOR_PLAN_H_

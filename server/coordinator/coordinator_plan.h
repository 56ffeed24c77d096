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

// Not thread-safe: the coordinator calls it under its own lock.
class CoordinatorPlans {
 public:
  // `store` outlives this object; `spec` empty: no planning (uniform maps).
  CoordinatorPlans(CoordinatorStore* store, std::optional<v1::PlanSpec> spec,
                   uint32_t num_slots)
      : store_(store), spec_(std::move(spec)), num_slots_(num_slots) {}

  bool enabled() const { return spec_.has_value(); }
  // Reads the stored plan (none stored: OK); DATA_LOSS when malformed.
  absl::Status Load();
  // The planned map (epoch 1) over `servers` (sorted addresses) for `job`;
  // stores the plan. FAILED_PRECONDITION without a job (`job` null).
  absl::StatusOr<v1::ShardMap> Build(const std::vector<std::string>& servers,
                                     const v1::JobConfig* job);
  // Records why planning failed (GetShardMap and Get report it).
  void SetError(std::string error) { error_ = std::move(error); }
  const std::string& error() const { return error_; }
  // The plan the map was built from; NOT_FOUND when planning is off and none
  // is stored; UNAVAILABLE, with the planner's error, when it failed or has
  // not run yet.
  absl::StatusOr<v1::ShardingPlan> Get() const;

 private:
  CoordinatorStore* const store_;
  const std::optional<v1::PlanSpec> spec_;
  const uint32_t num_slots_;
  v1::ShardingPlan plan_;  // plan_id 0: none
  std::string error_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_COORDINATOR_PLAN_H_

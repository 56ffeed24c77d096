#include "server/coordinator/coordinator_plan.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "server/planner/planner.h"

namespace recps::server {
namespace {

constexpr char kPlanKey[] = "plan";

// The topology for `servers`: each address's ServerSpec from the spec, or
// the spec's entry without an address (the default for every server).
absl::StatusOr<v1::Topology> TopologyFor(
    const v1::PlanSpec& spec, const std::vector<std::string>& servers,
    const v1::JobConfig& job, uint32_t num_slots) {
  const v1::Topology& given = spec.topology();
  const v1::ServerSpec* fallback = nullptr;
  for (const v1::ServerSpec& s : given.servers()) {
    if (s.address().empty()) fallback = &s;
  }
  v1::Topology topo = given;
  topo.clear_servers();
  for (const std::string& address : servers) {
    const v1::ServerSpec* found = fallback;
    for (const v1::ServerSpec& s : given.servers()) {
      if (s.address() == address) found = &s;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan spec: no servers entry for ", address,
                       " and no default (an entry without address)"));
    }
    v1::ServerSpec* s = topo.add_servers();
    *s = *found;
    s->set_address(address);
  }
  if (topo.batch_size() == 0) topo.set_batch_size(job.training().batch_size());
  if (topo.num_workers() == 0) topo.set_num_workers(1);
  topo.set_num_slots(num_slots);
  return topo;
}

}  // namespace

absl::StatusOr<Sharding> ParseSharding(const std::string& name) {
  if (name == "planned") return Sharding::kPlanned;
  if (name == "even") return Sharding::kEven;
  return absl::InvalidArgumentError(
      absl::StrCat("--sharding=", name, ": expected planned or even"));
}

absl::StatusOr<v1::PlanSpec> CoordinatorPlans::SpecFromReports(
    const std::vector<std::string>& servers,
    const std::vector<v1::ServerSpec>& reported) const {
  v1::PlanSpec spec;
  v1::Topology* topology = spec.mutable_topology();
  for (size_t i = 0; i < servers.size(); ++i) {
    if (i >= reported.size() || reported[i].memory_bytes() <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard server ", servers[i], " reported no memory at registration (an older "
          "recps-shard?); give the coordinator --plan_spec"));
    }
    v1::ServerSpec* s = topology->add_servers();
    *s = reported[i];
    s->set_address(servers[i]);
  }
  topology->set_num_workers(std::max(num_workers_, 1));
  return spec;
}

absl::StatusOr<v1::ShardMap> CoordinatorPlans::Build(
    const std::vector<std::string>& servers, const std::vector<v1::ServerSpec>& reported,
    const v1::JobConfig* job) {
  if (job == nullptr) {
    return absl::FailedPreconditionError(
        "planning needs the job's tables: start the coordinator with "
        "--job=FILE");
  }
  v1::PlanSpec spec;
  if (spec_.has_value()) {
    spec = *spec_;
  } else {
    ASSIGN_OR_RETURN(spec, SpecFromReports(servers, reported));
  }
  ASSIGN_OR_RETURN(*spec.mutable_topology(),
                   TopologyFor(spec, servers, *job, num_slots_));
  ASSIGN_OR_RETURN(
      v1::ShardingPlan plan,
      planner::PlanSharding(planner::PlannerInputFromJob(*job, spec)));
  plan.set_plan_id(plan_.plan_id() + 1);
  ASSIGN_OR_RETURN(v1::ShardMap map, planner::PlanToShardMap(plan, 1));
  RETURN_IF_ERROR(store_->Put(kPlanKey, plan.SerializeAsString()));
  plan_ = std::move(plan);
  error_.clear();
  LogInfo("planned the shard map (plan ", plan_.plan_id(), ", ",
          plan_.proposer(), "): predicted step ",
          plan_.predicted_step_seconds() * 1e3, " ms\n",
          planner::FormatPlan(plan_));
  return map;
}

absl::Status CoordinatorPlans::Load() {
  absl::StatusOr<std::string> stored = store_->Get(kPlanKey);
  if (absl::IsNotFound(stored.status())) return absl::OkStatus();
  RETURN_IF_ERROR(stored.status());
  if (!plan_.ParseFromString(*stored)) {
    return absl::DataLossError(absl::StrCat("coordinator state in ",
                                            store_->path(),
                                            ": the stored plan is malformed"));
  }
  return absl::OkStatus();
}

void CoordinatorPlans::SetFellBack(std::string why) {
  LogInfo("no sharding plan for the servers as they reported themselves (", why,
          "): spreading slots evenly");
  fell_back_ = std::move(why);
}

absl::StatusOr<v1::ShardingPlan> CoordinatorPlans::Get() const {
  if (plan_.plan_id() != 0) return plan_;
  if (!enabled()) {
    return absl::NotFoundError(
        "no sharding plan: the coordinator spreads slots evenly (--sharding=even)");
  }
  if (!fell_back_.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no sharding plan: the planner found none for the servers as they reported "
        "themselves (",
        fell_back_, "), so the coordinator spreads slots evenly"));
  }
  if (!error_.empty()) {
    return absl::UnavailableError(
        absl::StrCat("the sharding planner failed: ", error_));
  }
  return absl::UnavailableError(
      "no plan yet: the coordinator plans once enough shard servers "
      "registered");
}

std::optional<v1::ShardMap> CoordinatorPlans::BuildFirstMap(
    const std::vector<std::string>& servers, const std::vector<v1::ServerSpec>& reported,
    const v1::JobConfig* job, int replication) {
  std::optional<v1::ShardMap> planned;
  if (enabled()) {
    absl::StatusOr<v1::ShardMap> built = Build(servers, reported, job);
    if (built.ok()) {
      planned = *std::move(built);
    } else if (failure_blocks()) {
      SetError(absl::StrCat("the sharding planner failed: ", built.status().message()));
      LogError("no shard map: ", error_);
      return std::nullopt;
    } else {
      SetFellBack(std::string(built.status().message()));  // logs it
    }
  }
  v1::ShardMap map = planned.has_value() ? *std::move(planned)
                                         : ShardMap::Uniform(1, num_slots_, servers).ToProto();
  if (replication <= 1) return map;
  std::vector<std::string> zones;
  for (const v1::ServerSpec& spec : reported) zones.push_back(spec.zone());
  absl::StatusOr<ShardMap> replicated = ShardMap::FromProto(map);
  absl::Status placed = replicated.status();
  if (placed.ok()) placed = AddBackups(replication, zones, &*replicated);
  if (!placed.ok()) {
    SetError(absl::StrCat("cannot place the replicas: ", placed.message()));
    LogError("no shard map: ", error_);
    return std::nullopt;
  }
  return replicated->ToProto();
}

}  // namespace recps::server

// The coordinator's own Prometheus metrics (members, leases, the shard
// map's epoch, copies, failovers and refused pushes, parked KV waits), registered once per
// process. The orchestrators register theirs themselves.
#ifndef RECPS_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
#define RECPS_SERVER_COORDINATOR_COORDINATOR_METRICS_H_

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace recps::server {

struct CoordinatorMetrics {
  explicit CoordinatorMetrics(prometheus::Registry& registry)
      : members(prometheus::BuildGauge()
                    .Name("recps_coordinator_members")
                    .Help("Registered members by role and lease state")
                    .Register(registry)),
        expirations(prometheus::BuildCounter()
                        .Name("recps_coordinator_lease_expirations_total")
                        .Help("Members whose lease ran out, by role")
                        .Register(registry)),
        epoch(prometheus::BuildGauge()
                  .Name("recps_coordinator_shard_map_epoch")
                  .Help("Epoch of the current shard map (0: none yet)")
                  .Register(registry)
                  .Add({})),
        replication(prometheus::BuildGauge()
                        .Name("recps_coordinator_replication")
                        .Help("Copies of each row the shard map keeps (1: no backups)")
                        .Register(registry)
                        .Add({})),
        under_replicated_units(
            prometheus::BuildGauge()
                .Name("recps_coordinator_under_replicated_units")
                .Help("Units of the shard map (slots, table-wise tables, column groups) "
                      "with fewer copies than its replication: a backup lost and not "
                      "yet replaced")
                .Register(registry)
                .Add({})),
        failovers(prometheus::BuildCounter()
                      .Name("recps_coordinator_failovers_total")
                      .Help("Lost shard servers by outcome: promoted (its backups own its "
                            "rows in a new map epoch), data_loss (a unit had no backup left: "
                            "checkpoint restart), store_error")
                      .Register(registry)),
        failover_seconds(prometheus::BuildHistogram()
                             .Name("recps_coordinator_failover_seconds")
                             .Help("From a lost shard server's last heartbeat to the map "
                                   "that promotes its backups (the lease is most of it)")
                             .Register(registry)
                             .Add({}, prometheus::Histogram::BucketBoundaries{
                                          0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60})),
        push_refusals(prometheus::BuildCounter()
                          .Name("recps_coordinator_shard_map_push_refusals_total")
                          .Help("Shard map pushes a shard server refused")
                          .Register(registry)
                          .Add({})),
        kv_pending_waits(prometheus::BuildGauge()
                             .Name("recps_coordinator_kv_pending_waits")
                             .Help("KvGet/KvWait calls parked until their keys "
                                   "are set (updated every tick)")
                             .Register(registry)
                             .Add({})),
        barrier_pending_waits(prometheus::BuildGauge()
                                  .Name("recps_coordinator_barrier_pending_waits")
                                  .Help("Barrier arrivals parked until every rank "
                                        "arrives (updated every tick)")
                                  .Register(registry)
                                  .Add({})) {
    // Every outcome from the start, at 0: alerts and dashboards see the
    // series before the first failover.
    for (const char* result : {"promoted", "data_loss", "store_error"}) {
      failovers.Add({{"result", result}});
    }
  }
  prometheus::Family<prometheus::Gauge>& members;
  prometheus::Family<prometheus::Counter>& expirations;
  prometheus::Gauge& epoch;
  prometheus::Gauge& replication;
  prometheus::Gauge& under_replicated_units;
  prometheus::Family<prometheus::Counter>& failovers;
  prometheus::Histogram& failover_seconds;
  prometheus::Counter& push_refusals;
  prometheus::Gauge& kv_pending_waits;
  prometheus::Gauge& barrier_pending_waits;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_COORDINATOR_COORDINATOR_METRICS_H_

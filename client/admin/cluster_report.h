// Turns ClusterSnapshots into the reports recpsctl prints (recps.v1 admin
// messages): rates and latency percentiles from two Stats samples, the
// imbalance between servers, health, tables and slot placement. Pure
// functions, tested without a cluster.
#ifndef RECPS_CLIENT_ADMIN_CLUSTER_REPORT_H_
#define RECPS_CLIENT_ADMIN_CLUSTER_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/admin/cluster_reader.h"
#include "recps/v1/admin.pb.h"
#include "recps/v1/shard_admin.pb.h"

namespace recps::client::admin {

// Status of the cluster in `after`. With `before` (an earlier snapshot of
// the same cluster, or null), rates and latencies cover the time between the
// two; without, they are averages since each server started.
v1::ClusterStatus BuildClusterStatus(const ClusterSnapshot* before,
                                     const ClusterSnapshot& after);

// Tables summed over servers, with each server's share.
v1::TablesReport BuildTablesReport(const ClusterSnapshot& snapshot);

// Slots and rows per server; per-slot rows when the snapshot has them.
v1::ShardsReport BuildShardsReport(const ClusterSnapshot& snapshot);

// Latency of `after` minus `before` (null: all of `after`), with the request
// rate over `seconds` (0: no rate).
v1::LatencySummary SummarizeRpc(const v1::RpcStats* before,
                                const v1::RpcStats& after, double seconds);

// The q-quantile (0 < q < 1) of a histogram as RpcStats holds it (one count
// per bound plus an overflow count), interpolating linearly inside the
// bucket; the largest bound when it falls in the overflow; 0 when empty.
double HistogramQuantile(const std::vector<double>& upper_bounds,
                         const std::vector<int64_t>& counts, double q);


// "0-127,256,300-301" for ascending slots.
std::string SlotRanges(const std::vector<uint32_t>& slots);

}  // namespace recps::client::admin

#endif  // RECPS_CLIENT_ADMIN_CLUSTER_REPORT_H_

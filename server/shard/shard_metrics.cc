#include "server/shard/shard_metrics.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recps::server {
namespace {

// 50 us .. ~100 s, doubling: RPC latencies and sync waits.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 50e-6; v < 120; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

ShardMetrics::ShardMetrics(prometheus::Registry& registry)
    : requests_(prometheus::BuildCounter()
                    .Name("recps_shard_requests_total")
                    .Help("RPCs finished, by method and gRPC status code")
                    .Register(registry)),
      latency_(prometheus::BuildHistogram()
                   .Name("recps_shard_request_seconds")
                   .Help("RPC latency from arrival to reply, by method")
                   .Register(registry)),
      bad_requests_(prometheus::BuildCounter()
                        .Name("recps_shard_bad_requests_total")
                        .Help("Requests refused as bad, by method and reason "
                              "(malformed, invalid_argument, over_limit)")
                        .Register(registry)),
      same_host_bytes_(prometheus::BuildCounter()
                           .Name("recps_shard_same_host_bytes_total")
                           .Help("Bytes of requests (PushGradients) and answers "
                                 "(Lookup) passed through a same-host caller's "
                                 "shared memory instead of the socket, by method")
                           .Register(registry)),
      same_host_mappings_(prometheus::BuildCounter()
                              .Name("recps_shard_same_host_mappings_total")
                              .Help("Same-host callers' memfds mapped; flat once a "
                                    "steady job's calls reuse their memfds")
                              .Register(registry)
                              .Add({})),
      lookup_ids_(prometheus::BuildCounter()
                      .Name("recps_shard_lookup_ids_total")
                      .Help("Ids served by Lookup")
                      .Register(registry)
                      .Add({})),
      lookup_bytes_(prometheus::BuildCounter()
                        .Name("recps_shard_lookup_bytes_total")
                        .Help("Row payload bytes returned by Lookup")
                        .Register(registry)
                        .Add({})),
      update_ids_(prometheus::BuildCounter()
                      .Name("recps_shard_updated_rows_total")
                      .Help("Gradient rows applied by the fused optimizer")
                      .Register(registry)
                      .Add({})),
      sync_wait_(prometheus::BuildHistogram()
                     .Name("recps_shard_sync_wait_seconds")
                     .Help("Time a lookup waited for its step to be ready")
                     .Register(registry)
                     .Add({}, LatencyBuckets())),
      forward_wait_(prometheus::BuildHistogram()
                        .Name("recps_shard_forward_wait_seconds")
                        .Help("Replication: time a primary's push waited for its "
                              "backups after its own apply")
                        .Register(registry)
                        .Add({}, LatencyBuckets())),
      replica_pushes_(prometheus::BuildCounter()
                          .Name("recps_shard_replica_pushes_total")
                          .Help("Replication: pushes forwarded by primaries that this "
                                "server took as a backup")
                          .Register(registry)
                          .Add({})),
      replica_lag_steps_(prometheus::BuildGauge()
                             .Name("recps_shard_replica_lag_steps")
                             .Help("Replication: steps the slowest of this server's "
                                   "replica clocks is behind its own clock")
                             .Register(registry)
                             .Add({})),
      table_rows_(prometheus::BuildGauge()
                      .Name("recps_shard_table_rows")
                      .Help("Rows stored, by table")
                      .Register(registry)),
      table_bytes_(prometheus::BuildGauge()
                       .Name("recps_shard_table_bytes")
                       .Help("Bytes of rows (weights and optimizer state), by table")
                       .Register(registry)),
      resident_bytes_(prometheus::BuildGauge()
                          .Name("recps_shard_resident_bytes")
                          .Help("Resident memory of the process")
                          .Register(registry)
                          .Add({})),
      checkpoint_rows_(prometheus::BuildCounter()
                           .Name("recps_shard_checkpoint_rows_written_total")
                           .Help("Rows written to checkpoint row files")
                           .Register(registry)
                           .Add({})),
      checkpoint_bytes_(prometheus::BuildCounter()
                            .Name("recps_shard_checkpoint_bytes_written_total")
                            .Help("Bytes of checkpoint row files written")
                            .Register(registry)
                            .Add({})),
      checkpoint_write_seconds_(
          prometheus::BuildHistogram()
              .Name("recps_shard_checkpoint_write_seconds")
              .Help("Time to write one checkpoint row file (in the background)")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{
                           0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300})),
      snapshot_stall_(prometheus::BuildGauge()
                          .Name("recps_shard_checkpoint_last_snapshot_stall_seconds")
                          .Help("How long the last checkpoint snapshot held "
                                "the store (pushes and lookups wait)")
                          .Register(registry)
                          .Add({})),
      restored_rows_(prometheus::BuildCounter()
                         .Name("recps_shard_checkpoint_restored_rows_total")
                         .Help("Rows imported by RestoreRows")
                         .Register(registry)
                         .Add({})),
      last_checkpoint_time_(
          prometheus::BuildGauge()
              .Name("recps_shard_checkpoint_last_written_unixtime")
              .Help("When the last checkpoint row file was complete, Unix "
                    "seconds (0: none yet)")
              .Register(registry)
              .Add({})) {}

void ShardMetrics::RecordCheckpointWrite(int64_t rows, int64_t bytes,
                                         double seconds) {
  checkpoint_rows_.Increment(static_cast<double>(rows));
  checkpoint_bytes_.Increment(static_cast<double>(bytes));
  checkpoint_write_seconds_.Observe(seconds);
  last_checkpoint_time_.Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
}

void ShardMetrics::SetSnapshotStall(double seconds) {
  snapshot_stall_.Set(seconds);
}

void ShardMetrics::RecordRestore(int64_t rows, double) {
  restored_rows_.Increment(static_cast<double>(rows));
}

void ShardMetrics::RecordRequest(const std::string& rpc, absl::StatusCode code,
                                 double seconds) {
  const std::string code_name = absl::StatusCodeToString(code);
  prometheus::Counter* counter;
  prometheus::Histogram* histogram;
  {
    absl::MutexLock lock(&mu_);
    const std::string key = absl::StrCat(rpc, "/", code_name);
    auto it = request_counters_.find(key);
    if (it == request_counters_.end()) {
      it = request_counters_
               .emplace(key, &requests_.Add({{"rpc", rpc}, {"code", code_name}}))
               .first;
    }
    counter = it->second;
    auto lit = latencies_.find(rpc);
    if (lit == latencies_.end()) {
      lit = latencies_.emplace(rpc, &latency_.Add({{"rpc", rpc}}, LatencyBuckets()))
                .first;
    }
    histogram = lit->second;
  }
  counter->Increment();
  histogram->Observe(seconds);
}

void ShardMetrics::AppendRpcStats(v1::StatsResponse* response) {
  // Copy the pointers out: the children live as long as the registry, and
  // collecting them needs no lock of ours.
  std::vector<std::pair<std::string, prometheus::Histogram*>> histograms;
  std::vector<std::pair<std::string, prometheus::Counter*>> counters;
  {
    absl::MutexLock lock(&mu_);
    histograms.assign(latencies_.begin(), latencies_.end());
    counters.assign(request_counters_.begin(), request_counters_.end());
  }
  std::sort(histograms.begin(), histograms.end());
  const std::string ok_suffix = absl::StrCat("/", absl::StatusCodeToString(absl::StatusCode::kOk));
  for (const auto& [rpc, histogram] : histograms) {
    const prometheus::ClientMetric metric = histogram->Collect();
    v1::RpcStats* stats = response->add_rpcs();
    stats->set_rpc(rpc);
    stats->set_count(static_cast<int64_t>(metric.histogram.sample_count));
    stats->set_latency_seconds_sum(metric.histogram.sample_sum);
    uint64_t below = 0;
    for (const prometheus::ClientMetric::Bucket& b : metric.histogram.bucket) {
      // The last bucket is +Inf: it becomes the overflow count.
      if (b.upper_bound != std::numeric_limits<double>::infinity()) {
        stats->add_bucket_upper_seconds(b.upper_bound);
      }
      stats->add_bucket_counts(static_cast<int64_t>(b.cumulative_count - below));
      below = b.cumulative_count;
    }
    int64_t errors = 0;
    const std::string prefix = absl::StrCat(rpc, "/");
    for (const auto& [key, counter] : counters) {
      if (absl::StartsWith(key, prefix) && !absl::EndsWith(key, ok_suffix)) {
        errors += static_cast<int64_t>(counter->Value());
      }
    }
    stats->set_errors(errors);
  }
}

bool LogLimiter::Allow(int64_t* suppressed) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (now - window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= max_per_window_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

void ShardMetrics::AddBadRequest(const std::string& rpc,
                                 const std::string& reason) {
  // Few distinct labels; Family::Add finds an existing child under its lock.
  bad_requests_.Add({{"rpc", rpc}, {"reason", reason}}).Increment();
}

void ShardMetrics::AddSameHostMapping() { same_host_mappings_.Increment(); }

void ShardMetrics::AddSameHostBytes(const std::string& rpc, int64_t bytes) {
  same_host_bytes_.Add({{"rpc", rpc}}).Increment(static_cast<double>(bytes));
}

void ShardMetrics::AddLookedUpIds(int64_t ids, int64_t bytes) {
  lookup_ids_.Increment(static_cast<double>(ids));
  lookup_bytes_.Increment(static_cast<double>(bytes));
}

void ShardMetrics::AddUpdatedIds(int64_t ids) {
  update_ids_.Increment(static_cast<double>(ids));
}

void ShardMetrics::RecordSyncWait(double seconds) { sync_wait_.Observe(seconds); }

void ShardMetrics::RecordForwardWait(double seconds) { forward_wait_.Observe(seconds); }

void ShardMetrics::AddReplicaPush() { replica_pushes_.Increment(); }

void ShardMetrics::SetReplicaLagSteps(int64_t steps) {
  replica_lag_steps_.Set(static_cast<double>(steps));
}

void ShardMetrics::SetTableRows(const std::string& table, int64_t rows,
                                int64_t bytes) {
  table_rows_.Add({{"table", table}}).Set(static_cast<double>(rows));
  table_bytes_.Add({{"table", table}}).Set(static_cast<double>(bytes));
}

void ShardMetrics::SetResidentBytes(int64_t bytes) {
  resident_bytes_.Set(static_cast<double>(bytes));
}

}  // namespace recps::server

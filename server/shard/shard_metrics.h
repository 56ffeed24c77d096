// Prometheus metrics of a shard server (prometheus-cpp). The server exposes
// them over HTTP at /metrics. Thread-safe.
#ifndef RECPS_SERVER_SHARD_SHARD_METRICS_H_
#define RECPS_SERVER_SHARD_SHARD_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "recps/v1/shard_admin.pb.h"

namespace recps::server {

// Lets at most `max_per_window` lines through per `window`, so that a flood
// of bad requests cannot fill the disk with logs. Thread-safe.
class LogLimiter {
 public:
  LogLimiter(int max_per_window, absl::Duration window)
      : max_per_window_(max_per_window), window_(window) {}
  // Whether this line may be written; then *suppressed is the number of
  // lines dropped since the last one written (to say so with it).
  bool Allow(int64_t* suppressed);

 private:
  const int max_per_window_;
  const absl::Duration window_;
  absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

class ShardMetrics {
 public:
  explicit ShardMetrics(prometheus::Registry& registry);

  // One finished RPC: counts it by method and status code and records its
  // latency.
  void RecordRequest(const std::string& rpc, absl::StatusCode code,
                     double seconds);
  // One request refused as bad: `reason` is malformed (does not parse),
  // invalid_argument or over_limit (RESOURCE_EXHAUSTED).
  void AddBadRequest(const std::string& rpc, const std::string& reason);
  void AddLookedUpIds(int64_t ids, int64_t bytes);
  // Same-host rows: a request's bytes (`rpc` Lookup: the answer; Push: the
  // request) passed through the caller's memory instead of the socket.
  void AddSameHostBytes(const std::string& rpc, int64_t bytes);
  void AddSameHostMapping();
  void AddUpdatedIds(int64_t ids);
  // Time a lookup waited for its step (sync and bounded modes).
  void RecordSyncWait(double seconds);
  // Replication: a primary's push waited `seconds` for its backups after
  // its own apply (the replication's added latency); a backup took a
  // forwarded push; how many steps the slowest replica clock is behind
  // this server's own.
  void RecordForwardWait(double seconds);
  void AddReplicaPush();
  void SetReplicaLagSteps(int64_t steps);
  void SetTableRows(const std::string& table, int64_t rows, int64_t bytes);
  void SetResidentBytes(int64_t bytes);
  // Checkpoints: one row file written (in the background), the last
  // snapshot's stall, one restore.
  void RecordCheckpointWrite(int64_t rows, int64_t bytes, double seconds);
  void SetSnapshotStall(double seconds);
  void RecordRestore(int64_t rows, double seconds);
  // Appends one RpcStats per method seen so far (sorted by name): counts,
  // errors and the latency histogram, for ShardAdmin.Stats.
  void AppendRpcStats(v1::StatsResponse* response);

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& bad_requests_;
  prometheus::Family<prometheus::Counter>& same_host_bytes_;
  prometheus::Counter& same_host_mappings_;
  prometheus::Counter& lookup_ids_;
  prometheus::Counter& lookup_bytes_;
  prometheus::Counter& update_ids_;
  prometheus::Histogram& sync_wait_;
  prometheus::Histogram& forward_wait_;
  prometheus::Counter& replica_pushes_;
  prometheus::Gauge& replica_lag_steps_;
  prometheus::Family<prometheus::Gauge>& table_rows_;
  prometheus::Family<prometheus::Gauge>& table_bytes_;
  prometheus::Gauge& resident_bytes_;
  prometheus::Counter& checkpoint_rows_;
  prometheus::Counter& checkpoint_bytes_;
  prometheus::Histogram& checkpoint_write_seconds_;
  prometheus::Gauge& snapshot_stall_;
  prometheus::Counter& restored_rows_;
  prometheus::Gauge& last_checkpoint_time_;

  absl::Mutex mu_;  // caches the per-label children (Family::Add locks too)
  absl::flat_hash_map<std::string, prometheus::Counter*> request_counters_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Histogram*> latencies_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_METRICS_H_

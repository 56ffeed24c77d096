// recps-worker --embedded_shard: a shard server in the worker's process
// (embedded_shard.h), and its flags.
#include "worker/embedded_shard.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/port_file.h"
#include "common/rpc/tls_flags.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, embedded_shard_listen, "127.0.0.1:0",
          "with --embedded_shard: its gRPC address, host:port (port 0: the "
          "OS picks)");
ABSL_FLAG(std::string, embedded_shard_advertise, "",
          "with --embedded_shard: its address in shard maps (default: the "
          "listen host with the bound port)");
ABSL_FLAG(std::string, embedded_shard_metrics_listen, "",
          "with --embedded_shard: its Prometheus /metrics address, host:port "
          "(empty: none)");
ABSL_FLAG(std::string, embedded_shard_port_file, "",
          "with --embedded_shard: write '<grpc port> <metrics port>' of the "
          "embedded shard server here once it serves");
ABSL_FLAG(std::string, embedded_shard_tls_cert, "",
          "with --embedded_shard and mutual TLS: the embedded shard server's "
          "certificate (role shard; CA from --tls_ca), for its gRPC server "
          "and its calls to other shard servers (slot moves need the shard "
          "role). Default: the worker's own --tls_cert");
ABSL_FLAG(std::string, embedded_shard_tls_key, "",
          "with --embedded_shard_tls_cert: its private key");
ABSL_FLAG(double, embedded_shard_prefault_fixed_tables, -1,
          "with --embedded_shard: as recps-shard --prefault_fixed_tables "
          "(negative, the default -1: --local_ranks / --world_size, this "
          "process's shard's share)");
ABSL_FLAG(uint32_t, embedded_shard_num_slots, 4096,
          "with --embedded_shard: slots of the cluster (as recps-shard "
          "--num_slots)");

namespace recps::worker {

// --embedded_shard: the job's tables served from this process, registered
// with the coordinator like a recps-shard (or alone, without one). Returns
// once it serves a shard map that lists it.
absl::StatusOr<std::unique_ptr<server::ShardProcess>> StartEmbeddedShard(
    const v1::JobConfig& job, int world, int local_ranks, const std::string& coordinator,
    absl::Duration wait) {
  server::ShardProcessOptions o;
  *o.tables.mutable_tables() = job.tables();
  o.seed = job.training().seed();
  const v1::ConsistencyConfig& c = job.training().consistency();
  o.consistency.mode = c.mode() == v1::ConsistencyConfig::BOUNDED ? server::ConsistencyMode::kBounded
                       : c.mode() == v1::ConsistencyConfig::ASYNC ? server::ConsistencyMode::kAsync
                                                                  : server::ConsistencyMode::kSync;
  o.consistency.staleness = c.staleness() > 0 ? c.staleness() : 1;
  o.consistency.world_size = world;
  o.num_slots = absl::GetFlag(FLAGS_embedded_shard_num_slots);
  o.listen = absl::GetFlag(FLAGS_embedded_shard_listen);
  o.advertise = absl::GetFlag(FLAGS_embedded_shard_advertise);
  o.metrics_listen = absl::GetFlag(FLAGS_embedded_shard_metrics_listen);
  o.coordinator = coordinator;
  o.standalone = coordinator.empty();
  const double prefault = absl::GetFlag(FLAGS_embedded_shard_prefault_fixed_tables);
  if (prefault > 1 || std::isnan(prefault)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--embedded_shard_prefault_fixed_tables=", prefault,
        " is out of range: it must be in [-1, 1] (negative: --local_ranks / --world_size)"));
  }
  o.prefault_fixed_share =
      prefault >= 0 ? prefault : std::min(1.0, static_cast<double>(local_ranks) / std::max(1, world));
  const std::string cert = absl::GetFlag(FLAGS_embedded_shard_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_embedded_shard_tls_key);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        "--embedded_shard_tls_cert and --embedded_shard_tls_key go together");
  }
  if (!cert.empty()) {
    const rpc::TlsFlagValues tls = rpc::GetTlsFlags();
    if (tls.insecure || tls.ca.empty()) {
      return absl::InvalidArgumentError(
          "--embedded_shard_tls_cert needs mutual TLS (--tls_ca, --tls_cert, --tls_key)");
    }
    o.security = rpc::TransportSecurity::Tls(tls.ca, cert, key, tls.reload_interval);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<server::ShardProcess> shard,
                   server::ShardProcess::Create(std::move(o)));
  RETURN_IF_ERROR(shard->Serve());
  if (const std::string path = absl::GetFlag(FLAGS_embedded_shard_port_file); !path.empty()) {
    RETURN_IF_ERROR(WritePortFile(path, shard->grpc_port(), shard->metrics_port()));
  }
  // The coordinator sends the map once every shard server registered.
  const absl::Time deadline = absl::Now() + wait;
  while (!shard->serving()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the embedded shard server ", shard->address(), " received no shard map from "
          "coordinator ", coordinator, " within --resume_timeout=", absl::FormatDuration(wait),
          " (are all of the job's shard servers started?)"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  LogInfo("embedded shard server ", shard->address(), " serves; this worker reaches it "
          "in process");
  return shard;
}

void WaitForPeers(Collectives* collectives) {
  if (collectives == nullptr) return;
  if (absl::Status s = collectives->Barrier(); !s.ok()) {
    LogWarning("waiting for the other workers before stopping the embedded shard "
               "server: ", s.ToString());
  }
}

}  // namespace recps::worker

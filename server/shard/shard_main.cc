// recps-shard: a shard server. Serves the EmbeddingShard data plane and the
// ShardAdmin operations service over gRPC, and Prometheus metrics over HTTP.
//
//   recps-shard --tables=tables.textproto --world_size=2 --standalone
//
// Stops gracefully on SIGTERM or SIGINT: no new calls are accepted, calls in
// flight finish (up to --grace_period).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/stop_signals.h"
#include "common/rpc/gate_flags.h"
#include "common/rpc/tls_flags.h"
#include "common/malloc_tuning.h"
#include "common/port_file.h"
#include "common/config/text_proto.h"
#include "google/protobuf/stubs/logging.h"
#include "server/shard/shard_metrics.h"  // LogLimiter
#include "server/shard/shard_process.h"
#include "recps/v1/job.pb.h"
#include "common/config/table_config.h"
#include "common/flags_usage.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "gRPC address to listen on, host:port; port 0 lets the OS pick");
ABSL_FLAG(std::string, advertise, "",
          "this server's address in shard maps (default: the listen host with "
          "the bound port)");
ABSL_FLAG(std::string, zone, "",
          "the failure domain this server runs in (a rack, a Kubernetes "
          "topology zone), told to the coordinator: with replication, the "
          "replicas of a row go to servers of different zones. Empty: a zone "
          "of its own");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Prometheus /metrics HTTP address, host:port (port 0: OS picks); "
          "empty disables metrics");
ABSL_FLAG(std::string, tables, "",
          "path of the tables config (text-format recps.v1.TablesConfig); "
          "this or --job is required");
ABSL_FLAG(std::string, job, "",
          "path of a job config (text-format recps.v1.JobConfig): serve its "
          "tables, seeded by its training.seed");
ABSL_FLAG(std::string, consistency, "",
          "sync (BSP: wait for every worker each step), bounded (lookups run "
          "up to --staleness steps ahead) or async (apply on arrival); "
          "default: the job's training.consistency with --job, else sync");
ABSL_FLAG(int, staleness, -1,
          "steps a lookup may run ahead in bounded mode (default: the job's, "
          "else 1)");
ABSL_FLAG(int, world_size, 1, "number of workers in the job");
ABSL_FLAG(absl::Duration, step_timeout, absl::Seconds(60),
          "how long a lookup waits for its step before failing with the "
          "missing workers named");
ABSL_FLAG(uint64_t, seed, 0,
          "seed of the deterministic row initialisation (with --job: the "
          "job's training.seed)");
ABSL_FLAG(uint32_t, num_slots, 4096, "slots of the cluster (fixed for its life)");
ABSL_FLAG(bool, standalone, false,
          "serve every slot alone (shard map epoch 1 with this server only); "
          "otherwise wait for ShardAdmin.SetShardMap");
ABSL_FLAG(int64_t, max_rows_per_table, int64_t{1} << 26,
          "most rows a dynamic table may hold on this server");
ABSL_FLAG(int64_t, max_ids_per_request, int64_t{1} << 22,
          "most ids one Lookup or PushGradients may carry");
ABSL_FLAG(int, max_parked_lookups, 4096,
          "most lookups waiting for their step at once (sync and bounded "
          "modes); more are refused with RESOURCE_EXHAUSTED (1..1048576)");
ABSL_FLAG(int64_t, max_parked_ids, int64_t{1} << 24,
          "most ids over all lookups waiting for their step; more are refused "
          "with RESOURCE_EXHAUSTED (1..2^34)");
ABSL_FLAG(std::string, device, "cpu",
          "where rows live: cpu (host memory) or cuda:N (GPU N; docs/gpu.md)");
ABSL_FLAG(int, max_message_mb, 1024,
          "largest request accepted, in MiB (1..2047)");
ABSL_FLAG(int, threads, 0,
          "threads for pushes and for lookups released by a step (0: one per "
          "core)");
ABSL_FLAG(int, move_streams, 2,
          "slot moves: ExportRows streams a copy round pulls at once, each "
          "over every k-th slot of the move (1..64)");
ABSL_FLAG(int64_t, move_chunk_bytes, int64_t{1} << 20,
          "slot moves: bytes of rows per ExportRows chunk this server asks "
          "its source for (4 KiB..16 MiB)");
ABSL_FLAG(int, move_max_rounds, 8,
          "slot moves: most copy rounds of a MigrateIn (the first copies "
          "every row, later ones the rows changed meanwhile)");
ABSL_FLAG(int, store_threads, 0,
          "threads one large store call (lookup or update of 4096+ ids) is "
          "split over (0: one per core; 1: the request's own thread)");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(10),
          "on SIGTERM, how long calls in flight may take to finish");
ABSL_FLAG(std::string, coordinator, "",
          "coordinator address, host:port: register there as a shard server, "
          "keep the lease by heartbeat and take the shard map it pushes");
ABSL_FLAG(std::string, health_listen, "",
          "if set, a plaintext port (host:port) serving only grpc.health.v1, "
          "SERVING once the shard map is installed: for probes that cannot "
          "present a client certificate (the kubelet's gRPC probe)");
ABSL_FLAG(double, prefault_fixed_tables, -1,
          "commit at start the memory of this share (0..1] of every fixed "
          "table's rows, the share this server expects to hold (a first touch "
          "inside a training step costs more); 0: none, memory is committed as "
          "rows appear; negative (default -1): 1 with --standalone, else 0");
ABSL_FLAG(bool, same_host_rows, true,
          "for workers on this host's loopback, read pushes from and write "
          "lookup answers to their shared memory instead of the socket "
          "(docs/shard-server.md, Same-host rows); false: bytes always");
ABSL_FLAG(std::string, port_file, "",
          "if set, write '<grpc port> <metrics port>' here once serving (for "
          "launchers and tests)");

namespace recps::server {
namespace {

// Flags win; unset ones come from the job (when there is one).
absl::StatusOr<ConsistencyOptions> ConsistencyFromFlags(
    const v1::ConsistencyConfig* job) {
  ConsistencyOptions c;
  std::string mode = absl::GetFlag(FLAGS_consistency);
  int staleness = absl::GetFlag(FLAGS_staleness);
  if (mode.empty()) {
    mode = "sync";
    if (job != nullptr && job->mode() == v1::ConsistencyConfig::BOUNDED) mode = "bounded";
    if (job != nullptr && job->mode() == v1::ConsistencyConfig::ASYNC) mode = "async";
  }
  if (staleness < 0) {
    staleness = job != nullptr && job->staleness() > 0 ? job->staleness() : 1;
  }
  if (mode == "sync") {
    c.mode = ConsistencyMode::kSync;
  } else if (mode == "bounded") {
    c.mode = ConsistencyMode::kBounded;
  } else if (mode == "async") {
    c.mode = ConsistencyMode::kAsync;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--consistency=", mode, ": expected sync, bounded or async"));
  }
  c.staleness = staleness;
  c.world_size = absl::GetFlag(FLAGS_world_size);
  c.step_timeout = absl::GetFlag(FLAGS_step_timeout);
  c.max_parked_lookups = absl::GetFlag(FLAGS_max_parked_lookups);
  c.max_parked_ids = absl::GetFlag(FLAGS_max_parked_ids);
  if (c.staleness < 0) return absl::InvalidArgumentError("--staleness must be >= 0");
  if (c.world_size < 1) return absl::InvalidArgumentError("--world_size must be >= 1");
  return c;
}

// Set when the coordinator refused the registration: exit non-zero.
std::atomic<bool> registration_refused{false};

// Ranges of the numeric flags: what the server can honour without overflow
// (max_message_mb is shifted into an int of bytes) or nonsense.
constexpr int kMaxMessageMb = 2047;  // 2047 << 20 < 2^31
constexpr int kMaxWorldSize = 65536;
constexpr int kMaxStaleness = 1 << 20;
constexpr int kMaxThreads = 1024;
constexpr uint32_t kMaxNumSlots = 1 << 20;
constexpr int64_t kMaxRowsPerTable = int64_t{1} << 36;
// The client's dedup indexes a call's ids with int32.
constexpr int64_t kMaxIdsPerRequest = int64_t{1} << 30;
constexpr absl::Duration kMaxStepTimeout = absl::Hours(24);
constexpr absl::Duration kMaxGracePeriod = absl::Hours(1);

template <typename T>
absl::Status InRange(const char* flag, T value, T lo, T hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "=", value, " is out of range: it must be in [", lo, ", ",
      hi, "]"));
}

absl::Status InRange(const char* flag, absl::Duration value, absl::Duration lo,
                     absl::Duration hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "=", absl::FormatDuration(value),
      " is out of range: it must be in [", absl::FormatDuration(lo), ", ",
      absl::FormatDuration(hi), "]"));
}

// Every numeric flag, checked before anything starts.
absl::Status ValidateFlags() {
  const absl::Status checks[] = {
      InRange("max_message_mb", absl::GetFlag(FLAGS_max_message_mb), 1,
              kMaxMessageMb),
      InRange("world_size", absl::GetFlag(FLAGS_world_size), 1, kMaxWorldSize),
      // -1: the job's staleness (or 1).
      InRange("staleness", absl::GetFlag(FLAGS_staleness), -1, kMaxStaleness),
      InRange("step_timeout", absl::GetFlag(FLAGS_step_timeout),
              absl::Milliseconds(1), kMaxStepTimeout),
      InRange("num_slots", absl::GetFlag(FLAGS_num_slots), uint32_t{1},
              kMaxNumSlots),
      InRange("prefault_fixed_tables", absl::GetFlag(FLAGS_prefault_fixed_tables), -1.0, 1.0),
      InRange("max_rows_per_table", absl::GetFlag(FLAGS_max_rows_per_table),
              int64_t{1}, kMaxRowsPerTable),
      InRange("max_ids_per_request", absl::GetFlag(FLAGS_max_ids_per_request),
              int64_t{1}, kMaxIdsPerRequest),
      InRange("max_parked_lookups", absl::GetFlag(FLAGS_max_parked_lookups), 1,
              1 << 20),
      InRange("max_parked_ids", absl::GetFlag(FLAGS_max_parked_ids), int64_t{1},
              int64_t{1} << 34),
      InRange("threads", absl::GetFlag(FLAGS_threads), 0, kMaxThreads),
      InRange("store_threads", absl::GetFlag(FLAGS_store_threads), 0,
              kMaxThreads),
      InRange("grace_period", absl::GetFlag(FLAGS_grace_period),
              absl::ZeroDuration(), kMaxGracePeriod),
  };
  for (const absl::Status& s : checks) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// protobuf's own log lines (e.g. one per request with invalid UTF-8 in a
// string field) go through our log, at most 10 per 10 s: a flood of bad
// requests wrote 2,600 lines before. The requests themselves are counted
// in recps_shard_bad_requests_total.
void LimitProtobufLogs() {
  static LogLimiter* const limiter = new LogLimiter(10, absl::Seconds(10));
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel level,
                                     const char* file, int line,
                                     const std::string& message) {
    int64_t suppressed = 0;
    if (level < google::protobuf::LOGLEVEL_WARNING ||
        !limiter->Allow(&suppressed)) {
      return;
    }
    const std::string text = absl::StrCat(
        "libprotobuf ", file, ":", line, ": ", message,
        suppressed > 0 ? absl::StrCat(" [", suppressed,
                                      " protobuf lines suppressed before this one]")
                       : "");
    if (level == google::protobuf::LOGLEVEL_WARNING) {
      LogWarning(text);
    } else {
      LogError(text);
    }
  });
}

int Run() {
  // Signals are taken by sigwait below; block them before any thread starts
  // so every thread inherits the mask.
  const sigset_t stop_signals = BlockStopSignals();

  LimitProtobufLogs();
  if (absl::Status s = ValidateFlags(); !s.ok()) {
    LogError(s.message());
    return 2;
  }
  const std::string tables_path = absl::GetFlag(FLAGS_tables);
  const std::string job_path = absl::GetFlag(FLAGS_job);
  if (tables_path.empty() == job_path.empty()) {
    LogError("give exactly one of --tables (a text-format recps.v1.TablesConfig) "
             "or --job (a recps.v1.JobConfig)");
    return 2;
  }
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<v1::TablesConfig> config;
  v1::JobConfig job;
  if (!job_path.empty()) {
    if (absl::Status s = ReadTextProto(job_path, &job); !s.ok()) {
      LogError(s.message());
      return 2;
    }
    config = v1::TablesConfig();
    *config->mutable_tables() = job.tables();
    seed = job.training().seed();
  } else {
    config = config::ReadTablesConfig(tables_path);
  }
  if (!config.ok()) {
    LogError(config.status().message());
    return 2;
  }
  absl::StatusOr<std::vector<config::TableSpec>> specs = config::TableSpecsFromConfig(*config);
  absl::StatusOr<ConsistencyOptions> consistency = ConsistencyFromFlags(
      job_path.empty() ? nullptr : &job.training().consistency());
  for (const absl::Status& s : {specs.status(), consistency.status()}) {
    if (!s.ok()) {
      LogError(s.message());
      return 2;
    }
  }

  absl::StatusOr<rpc::CallGateOptions> gate_options = rpc::CallGateOptionsFromFlags();
  if (!gate_options.ok()) {
    LogError(gate_options.status().message());
    return 2;
  }
  ShardProcessOptions options;
  options.tables = *std::move(config);
  options.seed = seed;
  options.consistency = *consistency;
  options.num_slots = absl::GetFlag(FLAGS_num_slots);
  options.max_rows_per_table = absl::GetFlag(FLAGS_max_rows_per_table);
  options.max_ids_per_request = absl::GetFlag(FLAGS_max_ids_per_request);
  options.device = absl::GetFlag(FLAGS_device);
  options.max_message_mb = absl::GetFlag(FLAGS_max_message_mb);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.store_threads = absl::GetFlag(FLAGS_store_threads);
  options.move_streams = absl::GetFlag(FLAGS_move_streams);
  options.move_chunk_bytes = absl::GetFlag(FLAGS_move_chunk_bytes);
  options.move_max_rounds = absl::GetFlag(FLAGS_move_max_rounds);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.zone = absl::GetFlag(FLAGS_zone);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  options.same_host_rows = absl::GetFlag(FLAGS_same_host_rows);
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.standalone = absl::GetFlag(FLAGS_standalone);
  const double prefault = absl::GetFlag(FLAGS_prefault_fixed_tables);
  options.prefault_fixed_share = prefault >= 0 ? prefault : options.standalone ? 1 : 0;
  options.gate = *gate_options;
  // To this thread, not the process: a signal sent to the process goes to
  // any thread that does not block it, and one did in a CI run (the shard
  // died of SIGTERM, exit 143, without "received signal" in its log; not
  // reproduced since). Sent to this thread, it can only end the sigwait
  // below, or wait for it.
  const pthread_t main_thread = pthread_self();
  options.on_registration_refused = [main_thread](const absl::Status&) {
    registration_refused.store(true);
    pthread_kill(main_thread, SIGTERM);
  };
  absl::StatusOr<std::unique_ptr<ShardProcess>> process =
      ShardProcess::Create(std::move(options));
  if (!process.ok()) {
    LogError(process.status().message());
    return 2;
  }
  if (absl::Status s = (*process)->Serve(); !s.ok()) {
    LogError(s.message());
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s =
            WritePortFile(path, (*process)->grpc_port(), (*process)->metrics_port());
        !s.ok()) {
      LogError(s.message());
      return 1;
    }
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  LogInfo("received signal ", signal_number, "; finishing calls in flight");
  (*process)->Stop(absl::GetFlag(FLAGS_grace_period));
  LogInfo("stopped");
  // Everything that holds data is closed. Skip the metrics exposer's
  // destructor: civetweb polls its threads down for about a second, which
  // would only delay a restart or a rolling update.
  std::fflush(nullptr);
  _exit(registration_refused.load() ? 2 : 0);
}

}  // namespace
}  // namespace recps::server

int main(int argc, char** argv) {
  recps::SetFlagsUsageFromMainFile(__FILE__);
  absl::SetProgramUsageMessage(
      "recps shard server: owns the rows of its slots and serves batched "
      "lookups and fused gradient updates.\n"
      "  recps-shard --tables=FILE [--world_size=N] [--consistency=sync] "
      "[--standalone]");
  absl::ParseCommandLine(argc, argv);
  recps::SetLogTag("recps-shard");
  recps::rpc::InitProcessSecurityFromFlags();
  recps::TuneDataPlaneProcess();
  return recps::server::Run();
}

// recps-coordinator: cluster membership with leases, the shard map, the job
// config and a rendezvous key-value store, over gRPC; Prometheus metrics
// over HTTP. State lives in RocksDB under --state_dir, so a restarted
// coordinator carries on with the same map and epoch.
//
//   recps-coordinator --state_dir=/var/lib/recps/coord --job=job.textproto
//       --num_shards=2
//
// Stops gracefully on SIGTERM or SIGINT: watch streams and waits end with
// UNAVAILABLE, calls in flight finish, the state is closed.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/stop_signals.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config/job_config.h"
#include "common/log.h"
#include "common/rpc/channels.h"
#include "common/rpc/gate_flags.h"
#include "common/rpc/health_port.h"
#include "common/rpc/tls_flags.h"
#include "common/port_file.h"
#include "common/config/text_proto.h"
#include "common/flags_usage.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/coordinator_store.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "gRPC address to listen on, host:port; port 0 lets the OS pick");
ABSL_FLAG(std::string, state_dir, "",
          "directory of the coordinator's RocksDB state (members, shard map, "
          "job, key-value entries); required. Reuse it to restart with the "
          "same map and epoch");
ABSL_FLAG(std::string, job, "",
          "path of the job (text-format recps.v1.JobConfig) handed to every "
          "member; optional when the state dir already holds one (it must "
          "then be the same job)");
ABSL_FLAG(bool, replace_job, false,
          "when the state dir holds a different job that no worker has "
          "registered for yet (no training progress), replace it with --job; "
          "refused, saying why, once a worker registered for it");
ABSL_FLAG(int, num_shards, 0,
          "shard servers to wait for: once this many registered, the "
          "coordinator builds shard map epoch 1 over them and pushes it. "
          "0: never build a map automatically");
ABSL_FLAG(std::string, sharding, "planned",
          "how shard map epoch 1 places the tables: planned (the sharding "
          "planner, from --plan_spec or else from the memory and device each "
          "shard server reports at registration; slots spread evenly when "
          "that plans nothing) or even (every table row-wise over every "
          "server, slots in equal blocks)");
ABSL_FLAG(std::string, plan_spec, "",
          "path of a text-format recps.v1.PlanSpec (topology: server memory, "
          "bandwidth, workers, batch; per-table hints) for the sharding "
          "planner, instead of what the shard servers report; a plan that "
          "does not fit then leaves the cluster without a map, saying why "
          "(docs/planner.md)");
ABSL_FLAG(uint32_t, num_slots, 4096,
          "slots of the cluster (fixed for its life; a stored map keeps its own)");
ABSL_FLAG(int, replication, 0,
          "copies of every embedding row (1..8): each slot gets a primary and "
          "replication - 1 backups on other shard servers (other --zone "
          "values where servers give theirs). 0: the job's `replication`, "
          "else 1");
ABSL_FLAG(int, world_size, 0,
          "workers of the job: the largest barrier count and worker rank + 1 "
          "accepted. 0: not known, --max_members bounds them instead");
ABSL_FLAG(int, max_members, 1024,
          "members kept (alive, expired and left); registering one more is "
          "refused until `recpsctl members forget` removes an expired one. "
          "Also bounds open barriers, and barrier counts without --world_size");
ABSL_FLAG(int64_t, max_kv_key_bytes, 256, "longest key-value store key, in bytes");
ABSL_FLAG(int64_t, max_kv_value_bytes, 1 << 20,
          "largest key-value store value, in bytes (default 1 MiB)");
ABSL_FLAG(int64_t, max_kv_keys, 10000,
          "keys the job may hold in the key-value store (kept across runs of "
          "the job; a replaced job's keys are dropped)");
ABSL_FLAG(int64_t, max_kv_bytes, int64_t{256} << 20,
          "bytes of all keys and values of the job together (default 256 MiB)");
ABSL_FLAG(int, max_members_per_client, 64,
          "members one client (a certificate at one address) may register; "
          "its own expired and left members are forgotten first");
ABSL_FLAG(int, max_waits_per_client, 64,
          "waits (KvGet, KvWait) and barrier arrivals one client may have "
          "pending at once");
ABSL_FLAG(int64_t, max_kv_keys_per_client, 1000,
          "key-value store keys one client may create");
ABSL_FLAG(int64_t, max_kv_bytes_per_client, int64_t{16} << 20,
          "bytes of the keys and values one client created (default 16 MiB)");
ABSL_FLAG(absl::Duration, max_wait, absl::Hours(1),
          "longest wait or barrier timeout a caller may ask for; longer ones "
          "are cut to it");
ABSL_FLAG(absl::Duration, lease, absl::Seconds(10),
          "a member that sends no heartbeat for this long is marked expired");
ABSL_FLAG(absl::Duration, tick, absl::Milliseconds(50),
          "how often leases and wait timeouts are checked");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Prometheus /metrics HTTP address, host:port (port 0: OS picks); "
          "empty disables metrics");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(1),
          "on SIGTERM, how long calls in flight may take to finish (and "
          "clients to close their connections; watches and waits end at once)");
ABSL_FLAG(std::string, restore, "",
          "resume the job from a checkpoint: DIR (a checkpoint root: its newest "
          "complete checkpoint), DIR@STEP, or 'latest' (the newest under the "
          "job's training.checkpoint.dir). Checked at start (a bad checkpoint "
          "or another job's is an error naming the file); the shard servers "
          "restore their slots once the first map is on all of them, then "
          "workers get their step, dense state and data position "
          "(GetResumeState). Empty: a fresh run, refused when "
          "training.checkpoint.dir already holds complete checkpoints");
ABSL_FLAG(absl::Duration, checkpoint_cut_timeout, absl::Minutes(2),
          "every worker must arrive at a checkpoint cut within this of the "
          "first one, else the cut fails for all; also how long a complete cut "
          "waits for the previous checkpoint's files");
ABSL_FLAG(absl::Duration, checkpoint_write_timeout, absl::Minutes(30),
          "how long the shard servers may take to write a checkpoint's row "
          "files before it fails");
ABSL_FLAG(int64_t, max_dense_state_bytes, int64_t{1} << 30,
          "largest dense state (model and optimizer state) a worker may send "
          "at a checkpoint cut, in bytes (default 1 GiB); sets the gRPC "
          "receive limit with --max_kv_value_bytes");
ABSL_FLAG(int, max_parallel_moves, 4,
          "rebalancing: slot moves copying at once (each a MigrateIn on its "
          "target); hand-overs still run one at a time");
ABSL_FLAG(int64_t, move_max_bytes_per_second, 0,
          "rebalancing: bandwidth of all copies together, bytes/s, shared "
          "evenly by the copies running (0: no limit); ApplyRebalance may "
          "give its own");
ABSL_FLAG(double, move_rate_estimate, 100e6,
          "rebalancing: bytes/s a plan's time estimate assumes until this "
          "coordinator measured finished moves");
ABSL_FLAG(absl::Duration, move_copy_timeout, absl::Minutes(30),
          "rebalancing: deadline of one move's copy (MigrateIn); a copy that "
          "takes longer is rolled back");
ABSL_FLAG(absl::Duration, move_handover_timeout, absl::Minutes(2),
          "rebalancing: deadline of one hand-over (HandOver on the source)");
ABSL_FLAG(bool, auto_rebalance_new_servers, false,
          "rebalancing: when a shard server registers that is not in the "
          "shard map (it joined late), plan and apply a rebalance onto it "
          "(as `recpsctl rebalance --apply`)");
ABSL_FLAG(int, max_kept_moves, 1000,
          "rebalancing: finished moves kept in the state and listed by "
          "`recpsctl moves` (the oldest are dropped)");
ABSL_FLAG(std::string, health_listen, "",
          "if set, a plaintext port (host:port) serving only grpc.health.v1 "
          "(SERVING while the coordinator serves): for probes that cannot "
          "present a client certificate (the kubelet's gRPC probe)");
ABSL_FLAG(std::string, port_file, "",
          "if set, write '<grpc port> <metrics port>' here once serving (for "
          "launchers and tests)");

namespace recps::server {
namespace {

// The coordinator's options from its flags; INVALID_ARGUMENT naming the
// flags out of range.
absl::StatusOr<CoordinatorOptions> OptionsFromFlags() {
  CoordinatorOptions options;
  options.num_shards = absl::GetFlag(FLAGS_num_shards);
  options.num_slots = absl::GetFlag(FLAGS_num_slots);
  options.replication = absl::GetFlag(FLAGS_replication);
  if (options.replication < 0 || options.replication > 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replication=", options.replication, " must be in 0..8 (0: the job's)"));
  }
  if (options.num_shards > 0 && options.replication > options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replication=", options.replication, " needs at least that many shard servers; "
        "--num_shards=", options.num_shards));
  }
  options.lease = absl::GetFlag(FLAGS_lease);
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.max_members = absl::GetFlag(FLAGS_max_members);
  options.max_kv_key_bytes = absl::GetFlag(FLAGS_max_kv_key_bytes);
  options.max_kv_value_bytes = absl::GetFlag(FLAGS_max_kv_value_bytes);
  options.max_kv_keys = absl::GetFlag(FLAGS_max_kv_keys);
  options.max_kv_bytes = absl::GetFlag(FLAGS_max_kv_bytes);
  options.max_members_per_client = absl::GetFlag(FLAGS_max_members_per_client);
  options.max_waits_per_client = absl::GetFlag(FLAGS_max_waits_per_client);
  options.max_kv_keys_per_client = absl::GetFlag(FLAGS_max_kv_keys_per_client);
  options.max_kv_bytes_per_client = absl::GetFlag(FLAGS_max_kv_bytes_per_client);
  options.max_wait = absl::GetFlag(FLAGS_max_wait);
  if (options.max_members_per_client < 1 || options.max_waits_per_client < 1 ||
      options.max_kv_keys_per_client < 1 || options.max_kv_bytes_per_client < 1 ||
      options.max_wait < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "--max_members_per_client, --max_waits_per_client, "
        "--max_kv_keys_per_client and --max_kv_bytes_per_client must be >= 1, "
        "--max_wait >= 1s");
  }
  options.checkpoint.restore = absl::GetFlag(FLAGS_restore);
  options.checkpoint.cut_timeout = absl::GetFlag(FLAGS_checkpoint_cut_timeout);
  options.checkpoint.write_timeout = absl::GetFlag(FLAGS_checkpoint_write_timeout);
  options.moves.max_parallel_copies = absl::GetFlag(FLAGS_max_parallel_moves);
  options.moves.max_bytes_per_second = absl::GetFlag(FLAGS_move_max_bytes_per_second);
  options.moves.move_rate_estimate = absl::GetFlag(FLAGS_move_rate_estimate);
  options.moves.copy_timeout = absl::GetFlag(FLAGS_move_copy_timeout);
  options.moves.handover_timeout = absl::GetFlag(FLAGS_move_handover_timeout);
  options.moves.auto_rebalance_new_servers = absl::GetFlag(FLAGS_auto_rebalance_new_servers);
  options.moves.max_kept_moves = absl::GetFlag(FLAGS_max_kept_moves);
  if (options.moves.max_parallel_copies < 1 || options.moves.max_bytes_per_second < 0 ||
      options.moves.move_rate_estimate <= 0 || options.moves.max_kept_moves < 1) {
    return absl::InvalidArgumentError(
        "--max_parallel_moves and --max_kept_moves must be >= 1, "
        "--move_max_bytes_per_second >= 0, --move_rate_estimate > 0");
  }
  if (absl::GetFlag(FLAGS_max_dense_state_bytes) < 0) {
    return absl::InvalidArgumentError("--max_dense_state_bytes must be >= 0");
  }
  ASSIGN_OR_RETURN(options.sharding, ParseSharding(absl::GetFlag(FLAGS_sharding)));
  if (const std::string path = absl::GetFlag(FLAGS_plan_spec); !path.empty()) {
    if (options.sharding == Sharding::kEven) {
      return absl::InvalidArgumentError("--plan_spec plans the map: it needs --sharding=planned");
    }
    v1::PlanSpec spec;
    RETURN_IF_ERROR(ReadTextProto(path, &spec));
    options.plan_spec = std::move(spec);
  }
  return options;
}

// --job, read and checked as the workers check it (a job they would refuse
// is never stored); an empty job when the flag is not set.
absl::StatusOr<v1::JobConfig> JobFromFlags() {
  v1::JobConfig job;
  const std::string job_path = absl::GetFlag(FLAGS_job);
  if (job_path.empty()) return job;
  RETURN_IF_ERROR(ReadTextProto(job_path, &job));
  if (absl::Status s = config::ValidateJobConfig(job); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--job=", job_path, ": ", s.message()));
  }
  return job;
}

// What serves the coordinator: the metrics exposer, the call gate, the
// gRPC service and server, and the plaintext health port.
struct Serving {
  std::unique_ptr<prometheus::Exposer> exposer;
  int metrics_port = 0;
  std::unique_ptr<rpc::CallGate> gate;
  std::unique_ptr<CoordinatorService> service;
  std::unique_ptr<grpc::Server> server;
  int grpc_port = 0;
  std::unique_ptr<rpc::HealthPort> health_port;
};

// Starts serving `coordinator` on --listen (and --metrics_listen,
// --health_listen). INVALID_ARGUMENT for bad flags, UNAVAILABLE when a port
// cannot be taken.
absl::StatusOr<std::unique_ptr<Serving>> StartServing(
    Coordinator* coordinator, const std::shared_ptr<prometheus::Registry>& registry,
    const CoordinatorOptions& options, int64_t max_dense_state_bytes) {
  auto serving = std::make_unique<Serving>();
  if (const std::string addr = absl::GetFlag(FLAGS_metrics_listen); !addr.empty()) {
    serving->exposer = std::make_unique<prometheus::Exposer>(addr);
    serving->exposer->RegisterCollectable(registry);
    const std::vector<int> ports = serving->exposer->GetListeningPorts();
    serving->metrics_port = ports.empty() ? 0 : ports[0];
  }
  absl::StatusOr<rpc::CallGateOptions> gate_options = rpc::CallGateOptionsFromFlags();
  if (!gate_options.ok()) {
    return absl::InvalidArgumentError(gate_options.status().message());  // exit 2
  }
  serving->gate = std::make_unique<rpc::CallGate>(*gate_options, registry.get());
  serving->service = std::make_unique<CoordinatorService>(coordinator, registry.get());
  serving->service->set_gate(serving->gate.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  builder.AddListeningPort(
      listen, rpc::ServerCredentials(rpc::TransportSecurity(), serving->gate.get()),
      &serving->grpc_port);
  // No SO_REUSEPORT: gRPC sets it by default, and then a server started on
  // a port another process of the same user listens on (a restart on its
  // old port) silently shares it, the kernel splitting connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  rpc::ConfigureServerKeepalive(&builder);
  builder.RegisterService(serving->service.get());
  // Room for the largest value a KvSet may carry and the largest dense
  // state a checkpoint cut may carry, and not much more: a bigger request is
  // refused by gRPC before it is parsed.
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(
      std::max({options.max_kv_value_bytes + (1 << 20),
                max_dense_state_bytes + (1 << 20), int64_t{4} << 20}),
      INT32_MAX)));
  serving->server = builder.BuildAndStart();
  if (serving->server == nullptr || serving->grpc_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  if (const std::string h = absl::GetFlag(FLAGS_health_listen); !h.empty()) {
    absl::StatusOr<std::unique_ptr<rpc::HealthPort>> started = rpc::HealthPort::Start(h);
    if (!started.ok()) return absl::UnavailableError(started.status().message());
    serving->health_port = *std::move(started);
    serving->health_port->SetServing(true);
  }
  return serving;
}

int Run() {
  // Signals are taken by sigwait below; block them before any thread starts
  // so every thread inherits the mask.
  const sigset_t stop_signals = BlockStopSignals();

  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) {
    LogError("--state_dir is required (the directory of the coordinator's state)");
    return 2;
  }
  const std::string job_path = absl::GetFlag(FLAGS_job);
  absl::StatusOr<v1::JobConfig> job = JobFromFlags();
  if (!job.ok()) {
    LogError(job.status().message());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<CoordinatorStore>> store =
      CoordinatorStore::Open(state_dir);
  if (!store.ok()) {
    LogError(store.status().message());
    return 2;
  }
  absl::StatusOr<CoordinatorOptions> flag_options = OptionsFromFlags();
  if (!flag_options.ok()) {
    LogError(flag_options.status().message());
    return 2;
  }
  const CoordinatorOptions& options = *flag_options;
  const int64_t max_dense_state_bytes = absl::GetFlag(FLAGS_max_dense_state_bytes);
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(*std::move(store), options, registry.get());
  if (!coordinator.ok()) {
    LogError(coordinator.status().message());
    return 2;
  }
  if (!job_path.empty()) {
    if (absl::Status s = (*coordinator)->SetJob(*job, absl::GetFlag(FLAGS_replace_job));
        !s.ok()) {
      LogError(s.message());
      return 2;
    }
  } else if (absl::Status s = (*coordinator)->StoredJobStatus(); !s.ok()) {
    LogError(s.message());
    return 2;
  } else if (!(*coordinator)->GetJob().ok()) {
    LogWarning("no job yet (no --job, none in ", state_dir,
               "): members get none and GetJob fails");
  }
  // Resolves --restore (or refuses to overwrite checkpoints) before serving.
  if (absl::Status s = (*coordinator)->checkpoints().Start(); !s.ok()) {
    LogError(s.message());
    return 2;
  }
  // The pusher's thread outlives the coordinator (see the end of Run()):
  // it reports through a pointer that is cleared first.
  struct PushSink {
    absl::Mutex mu;
    Coordinator* coordinator ABSL_GUARDED_BY(mu) = nullptr;
  };
  auto sink = std::make_shared<PushSink>();
  {
    absl::MutexLock lock(&sink->mu);
    sink->coordinator = coordinator->get();
  }
  ShardMapPusher pusher([sink](const std::string& address, uint64_t epoch,
                               const absl::Status& outcome) {
    absl::MutexLock lock(&sink->mu);
    if (sink->coordinator != nullptr) {
      sink->coordinator->RecordMapPush(address, epoch, outcome);
    }
  });
  (*coordinator)
      ->SetMapPusher([&pusher](const std::string& address, const v1::ShardMap& map) {
        pusher.Push(address, map);
      });

  // After the pusher is set: resolving a move left in flight may install
  // a map, which must reach the servers.
  if (absl::Status s = (*coordinator)->moves().Start(); !s.ok()) {
    LogError(s.message());
    return 2;
  }

  absl::StatusOr<std::unique_ptr<Serving>> serving =
      StartServing(coordinator->get(), registry, options, max_dense_state_bytes);
  if (!serving.ok()) {
    LogError(serving.status().message());
    return absl::IsInvalidArgument(serving.status()) ? 2 : 1;
  }
  const int grpc_port = (*serving)->grpc_port;
  const int metrics_port = (*serving)->metrics_port;
  auto ticker =
      std::make_unique<CoordinatorTicker>(coordinator->get(), absl::GetFlag(FLAGS_tick));
  LogInfo("serving on port ", grpc_port, ", metrics on port ", metrics_port,
          ", state in ", state_dir, ", shard map epoch ",
          (*coordinator)->shard_map_epoch(), ", waiting for ", options.num_shards,
          " shard server(s)");
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WritePortFile(path, grpc_port, metrics_port); !s.ok()) {
      LogError(s.message());
      return 1;
    }
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  LogInfo("received signal ", signal_number, "; stopping");
  ticker.reset();
  // Ends watch streams and waits, which would never finish.
  (*serving)->service->Stop();
  (*serving)->server->Shutdown(std::chrono::system_clock::now() +
                               absl::ToChronoSeconds(absl::GetFlag(FLAGS_grace_period)));
  (*serving)->server->Wait();
  {
    absl::MutexLock lock(&sink->mu);
    sink->coordinator = nullptr;
  }
  coordinator->reset();  // closes RocksDB
  LogInfo("stopped");
  // The state is closed. Skip the metrics exposer's destructor (civetweb
  // polls its threads down for about a second) and the pusher's last retries.
  std::fflush(nullptr);
  _exit(0);
}

}  // namespace
}  // namespace recps::server

int main(int argc, char** argv) {
  recps::SetFlagsUsageFromMainFile(__FILE__);
  absl::SetProgramUsageMessage(
      "recps coordinator: membership and leases, the shard map, the job and a "
      "rendezvous key-value store for a recps cluster.\n"
      "  recps-coordinator --state_dir=DIR [--job=FILE] [--num_shards=N] "
      "[--num_slots=4096] [--lease=10s] [--restore=DIR[@STEP]|latest]");
  absl::ParseCommandLine(argc, argv);
  recps::SetLogTag("recps-coordinator");
  recps::rpc::InitProcessSecurityFromFlags();
  return recps::server::Run();
}

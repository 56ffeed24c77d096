#include "server/shard/shard_process.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/coordinator_client.h"
#include "common/config/job_config.h"
#include "common/human_bytes.h"
#include "common/log.h"
#include "common/rpc/channels.h"
#include "common/rpc/health_port.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/store/embedding_store.h"
#include "server/shard/fixed_row_committer.h"
#include "server/shard/in_process_shard.h"
#include "server/shard/shard_metrics.h"
#include "server/shard/shard_peer_grpc.h"
#include "server/shard/shard_server.h"
#include "server/shard/shard_service.h"
#include "server/store/store_footprint.h"

namespace recps::server {

namespace {

// MemAvailable from /proc/meminfo.
absl::StatusOr<int64_t> MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::stringstream text;
  text << in.rdbuf();
  return config::ParseMemAvailable(text.str());
}

// What this server tells the coordinator's sharding planner about itself
// (RegisterRequest.capacity), measured before its store takes memory: the
// host memory available, or the GPU's memory for a GPU store. Unreported
// (memory 0) when it cannot be read: the coordinator then spreads slots
// evenly.
v1::ServerSpec MeasureCapacity(kernels::Device device, int cuda_device,
                               int64_t max_rows_per_table) {
  v1::ServerSpec capacity;
  capacity.set_max_rows_per_table(max_rows_per_table);
  if (device == kernels::Device::kCuda) {
    capacity.set_device(v1::GPU);
    capacity.set_memory_bytes(DeviceStoreMemoryBytes(cuda_device));
    return capacity;
  }
  capacity.set_device(v1::CPU);
  if (absl::StatusOr<int64_t> available = MemAvailable(); available.ok()) {
    capacity.set_memory_bytes(*available);
  }
  return capacity;
}

// Memory of one committed row of a fixed table: the row, its id and its
// generation (8 bytes each).
double CommittedRowBytes(const config::TableSpec& spec) {
  return static_cast<double>(HostRowBytes(spec.optimizer.kind, spec.dim, spec.precision) + 16);
}

// The share of the fixed tables to commit at start: `share`, or 0 (with a
// warning) when that would take more than 80% of the memory the machine
// has available (the rest of the process needs some too). For a fixed table whose ids are sparse, lazily created
// rows may never need it all, and trading a slow first step for the OOM
// killer at start is a bad deal.
double PrefaultShare(const std::vector<config::TableSpec>& specs, double share) {
  if (share <= 0) return 0;
  share = std::min(1.0, share);
  double bytes = 0;
  for (const config::TableSpec& spec : specs) {
    if (spec.num_rows <= 0) continue;
    const auto rows = static_cast<double>(ExpectedFixedRows(spec.num_rows, share));
    // The rows, and the id map.
    bytes += rows * CommittedRowBytes(spec) +
             static_cast<double>(HostDenseIndexBytes(spec.num_rows));
  }
  if (bytes == 0) return share;
  const absl::StatusOr<int64_t> available = MemAvailable();
  if (available.ok() && bytes > 0.8 * static_cast<double>(*available)) {
    LogWarning("not committing the fixed tables' memory at start: ", HumanBytes(bytes),
               " (", 100 * share, "% of their rows) is more than 80% of the ",
               HumanBytes(static_cast<double>(*available)),
               " available; rows take their memory as they appear "
               "(--prefault_fixed_tables)");
    return 0;
  }
  return share;
}

}  // namespace

ShardProcess::ShardProcess(ShardProcessOptions options)
    : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<ShardProcess>> ShardProcess::Create(
    ShardProcessOptions options) {
  std::unique_ptr<ShardProcess> p(new ShardProcess(std::move(options)));
  const ShardProcessOptions& o = p->options_;
  ASSIGN_OR_RETURN(p->specs_, config::TableSpecsFromConfig(o.tables));

  p->compute_pool_ = std::make_unique<ThreadPool>(std::max(0, o.store_threads));
  StoreOptions store_options;
  store_options.seed = o.seed;
  store_options.num_slots = o.num_slots;
  store_options.max_rows_per_table = o.max_rows_per_table;
  store_options.pool = p->compute_pool_.get();
  absl::StatusOr<kernels::Device> device =
      kernels::ParseDevice(o.device, &store_options.cuda_device);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrCat("--device: ", device.status().message()));
  }
  store_options.device = *device;
  p->capacity_ =
      MeasureCapacity(*device, store_options.cuda_device, o.max_rows_per_table);
  p->capacity_.set_zone(o.zone);
  // A server that will hold every row (standalone, or expecting all of
  // them: the one server of a job) commits at start, before it registers,
  // with the store's threads (M-p1's 13 GiB: 0.7-14 s; done later beside
  // the first steps it took 20 s and a core from them). Otherwise each map
  // installed commits the share of each table it gives this server
  // (CommitOwnedFixedRows): a planned map gives uneven shares (all of one
  // table, none of another), and an expected 1/servers of every table at
  // start fell short on some and was waste on others (M-p1's service form:
  // 20.8 GiB peak against 13.8).
  const bool commit_at_start =
      o.standalone || o.prefault_fixed_share >= 1 || *device != kernels::Device::kCpu;
  store_options.prefault_fixed_share =
      commit_at_start ? PrefaultShare(p->specs_, o.prefault_fixed_share) : 0;
  const absl::Time store_start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingStore> store,
                   CreateEmbeddingStore(p->specs_, store_options));
  if (store_options.prefault_fixed_share > 0) {
    int64_t fixed_rows = 0;
    for (const config::TableSpec& spec : p->specs_) fixed_rows += spec.num_rows;
    if (fixed_rows > 0) {
      LogInfo(absl::StrFormat(
          "committed the memory of %.0f%% of the fixed tables' %d rows (this server's "
          "expected share) in %.1f s: a first touch inside a training step costs more",
          100 * store_options.prefault_fixed_share, fixed_rows,
          absl::ToDoubleSeconds(absl::Now() - store_start)));
    }
  }

  p->registry_ = std::make_shared<prometheus::Registry>();
  p->metrics_ = std::make_unique<ShardMetrics>(*p->registry_);

  ShardServerOptions server_options;
  server_options.num_slots = o.num_slots;
  server_options.max_ids_per_request = o.max_ids_per_request;
  server_options.consistency = o.consistency;
  server_options.work_threads = o.threads;
  server_options.move_streams = o.move_streams;
  server_options.move_chunk_bytes = o.move_chunk_bytes;
  server_options.move_max_rounds = o.move_max_rounds;
  // Health: NOT_SERVING until a map that lists this server is installed.
  // The health service exists only once the gRPC server is built (Serve):
  // the callback finds it through the atomic pointer. Maps arrive only
  // after Serve started the health port.
  ShardProcess* self = p.get();
  server_options.on_map_installed = [self] {
    if (grpc::HealthCheckServiceInterface* h = self->health_.load()) {
      h->SetServingStatus(true);
    }
    if (self->health_port_ != nullptr) self->health_port_->SetServing(true);
    self->CommitOwnedFixedRows();
  };
  // Column groups of column-wise tables: same seed, slots and limits.
  server_options.create_store = [store_options](std::vector<config::TableSpec> groups) {
    return CreateEmbeddingStore(std::move(groups), store_options);
  };
  // Slot moves and replication: this server pulls rows from, calls, and
  // forwards pushes to other shard servers over the same transport as the
  // data plane (same-host rows included).
  server_options.connect_peer = [security = o.security,
                                 same_host = o.same_host_rows](const std::string& address) {
    return ConnectGrpcShardPeer(address, security, same_host);
  };
  ASSIGN_OR_RETURN(p->shard_, ShardServer::Create(std::move(store), ShardMap(),
                                                  std::move(server_options),
                                                  p->metrics_.get()));
  if (o.prefault_fixed_share > 0 && !commit_at_start) {
    ShardServer* server = p->shard_.get();
    p->committer_ = std::make_unique<FixedRowCommitter>(
        [server](int table, int64_t rows) { server->CommitFixedRows(table, rows); },
        std::vector<int64_t>(p->specs_.size(), 0));
  }
  return p;
}

void ShardProcess::CommitOwnedFixedRows() {
  if (committer_ == nullptr) return;
  std::vector<int64_t> wanted = shard_->OwnedFixedRows();
  const std::vector<int64_t> committed = committer_->committed();
  double extra = 0;
  for (size_t t = 0; t < wanted.size() && t < specs_.size(); ++t) {
    const int64_t more = wanted[t] - (t < committed.size() ? committed[t] : 0);
    if (more > 0) {
      extra += static_cast<double>(more) * CommittedRowBytes(specs_[t]);
    }
  }
  if (extra <= 0) return;
  const absl::StatusOr<int64_t> available = MemAvailable();
  if (available.ok() && extra > 0.8 * static_cast<double>(*available)) {
    LogWarning("not committing the memory of the fixed tables' rows the shard map gives "
               "this server: ", HumanBytes(extra), " is over 80% of the ",
               HumanBytes(static_cast<double>(*available)),
               " available; rows take their memory as they appear (--prefault_fixed_tables)");
    return;
  }
  committer_->Want(std::move(wanted));
}

absl::Status ShardProcess::Serve() {
  const ShardProcessOptions& o = options_;
  if (!o.metrics_listen.empty()) {
    exposer_ = std::make_unique<prometheus::Exposer>(o.metrics_listen);
    exposer_->RegisterCollectable(registry_);
    const std::vector<int> ports = exposer_->GetListeningPorts();
    metrics_port_ = ports.empty() ? 0 : ports[0];
  }
  if (!o.health_listen.empty()) {
    ASSIGN_OR_RETURN(health_port_, rpc::HealthPort::Start(o.health_listen));
  }

  gate_ = std::make_unique<rpc::CallGate>(o.gate, registry_.get());
  data_service_ = std::make_unique<EmbeddingShardService>(shard_.get(), metrics_.get());
  admin_service_ = std::make_unique<ShardAdminService>(shard_.get(), metrics_.get());
  data_service_->set_gate(gate_.get());
  if (o.same_host_rows) data_service_->AllowSameHostRows();
  admin_service_->set_gate(gate_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RETURN_IF_ERROR(rpc::CheckTlsFiles(rpc::Resolve(o.security)));
  builder.AddListeningPort(o.listen, rpc::ServerCredentials(o.security, gate_.get()),
                           &grpc_port_);
  // No SO_REUSEPORT: gRPC sets it by default, and then a server started on
  // a port another process of the same user listens on (a restart on its
  // old port) silently shares it, the kernel splitting connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  rpc::ConfigureServerKeepalive(&builder);
  builder.RegisterService(data_service_.get());
  builder.RegisterService(admin_service_.get());
  builder.SetMaxReceiveMessageSize(o.max_message_mb << 20);
  builder.SetMaxSendMessageSize(-1);
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || grpc_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.listen));
  }
  if (grpc::HealthCheckServiceInterface* h = grpc_server_->GetHealthCheckService()) {
    h->SetServingStatus(false);  // the default service starts SERVING
    health_.store(h);
    // A map installed before the pointer was published.
    if (shard_->serving()) h->SetServingStatus(true);
  }

  advertise_ = o.advertise;
  if (advertise_.empty()) {
    const std::vector<std::string> host_port = absl::StrSplit(o.listen, ':');
    advertise_ = absl::StrCat(host_port.empty() ? "127.0.0.1" : host_port[0], ":",
                              grpc_port_);
  }
  endpoint_ = std::make_unique<ShardServerEndpoint>(shard_.get(), metrics_.get(),
                                                    advertise_);
  if (o.standalone) {
    v1::SetShardMapRequest set;
    *set.mutable_shard_map() = ShardMap::Uniform(1, o.num_slots, {advertise_}).ToProto();
    set.set_self(advertise_);
    RETURN_IF_ERROR(shard_->SetShardMap(set));
  } else {
    shard_->SetSelfAddress(advertise_);  // for maps that do not name `self`
  }
  LogInfo("serving ", specs_.size(), " table(s) on ", advertise_, " (",
          ConsistencyModeName(o.consistency.mode), ", world size ",
          o.consistency.world_size, "), metrics on port ", metrics_port_,
          o.standalone ? ", standalone" : ", waiting for a shard map");
  // Registers in the background (the coordinator may start later) and
  // keeps the lease; the map arrives via ShardAdmin.SetShardMap.
  if (!o.coordinator.empty()) {
    client::CoordinatorClientOptions coordinator_options;
    coordinator_options.call_timeout = absl::Seconds(5);  // bounds the wait at shutdown
    coordinator_options.security = o.security;  // a shard's, even inside a worker
    coordinator_ = std::make_unique<client::CoordinatorClient>(o.coordinator,
                                                               coordinator_options);
    v1::RegisterRequest request;
    request.set_role(v1::SHARD_SERVER);
    request.set_address(advertise_);
    request.set_rank(-1);
    // What the coordinator checks against the cluster and the job.
    request.set_num_slots(o.num_slots);
    *request.mutable_tables() = o.tables.tables();
    *request.mutable_capacity() = capacity_;
    request.set_incarnation(shard_->incarnation());
    lease_ = std::make_unique<client::CoordinatorLease>(
        coordinator_.get(), request, nullptr,
        [refused = o.on_registration_refused](const absl::Status& s) {
          LogError("the coordinator refused this shard server: ", s.message());
          if (refused) refused(s);
        },
        [shard = shard_.get()](absl::Time held_until) { shard->SetLeaseHeldUntil(held_until); },
        [shard = shard_.get()](v1::HeartbeatRequest* beat) {
          const Replication::LineageReport lineage = shard->LineageReport();
          beat->set_shard_map_epoch(lineage.epoch);
          beat->set_lost_primary_clocks(lineage.lost_primary_clocks);
        });
  }
  // Level metrics (resident memory, rows) between scrapes of Stats.
  gauges_ = std::thread([this] {
    do {
      shard_->RefreshGauges();
    } while (!stop_gauges_.WaitForNotificationWithTimeout(absl::Seconds(1)));
  });
  return absl::OkStatus();
}

bool ShardProcess::serving() const { return shard_ != nullptr && shard_->serving(); }

void ShardProcess::Stop(absl::Duration grace) {
  if (stopped_) return;
  stopped_ = true;
  if (gauges_.joinable()) {
    stop_gauges_.Notify();
    gauges_.join();
  }
  if (lease_ != nullptr) lease_->Leave();
  lease_.reset();
  // A move's call waits for its copy: end the moves first, or the shutdown
  // below would wait for them.
  if (shard_ != nullptr) shard_->StopMoves();
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() +
                           absl::ToChronoSeconds(grace));
    grpc_server_->Wait();
  }
  endpoint_.reset();
  shard_.reset();
}

ShardProcess::~ShardProcess() { Stop(absl::ZeroDuration()); }

}  // namespace recps::server

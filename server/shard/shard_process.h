// A whole shard server as one object: the store, ShardServer, the gRPC
// services and server, health, Prometheus metrics, the periodic gauges and
// the registration with the coordinator. recps-shard is this plus flags and
// signal handling; recps-worker --embedded_shard runs the same object inside
// the worker and reaches it through endpoint() without gRPC, while the
// coordinator, recpsctl and the other workers reach it over gRPC exactly as
// a recps-shard.
#ifndef RECPS_SERVER_SHARD_SHARD_PROCESS_H_
#define RECPS_SERVER_SHARD_SHARD_PROCESS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/in_process_shard.h"
#include "common/config/table_config.h"
#include "common/rpc/call_gate.h"
#include "common/rpc/channels.h"
#include "recps/v1/job.pb.h"
#include "recps/v1/plan.pb.h"
#include "server/shard/step_clock.h"

namespace grpc {
class Server;
class HealthCheckServiceInterface;
}  // namespace grpc
namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace recps {
class ThreadPool;
namespace client {
class CoordinatorClient;
class CoordinatorLease;
}  // namespace client
namespace rpc {
class HealthPort;
}  // namespace rpc

namespace server {

class FixedRowCommitter;
class ShardMetrics;
class ShardServer;
class EmbeddingShardService;
class ShardAdminService;

// recps-shard's flags (docs/shard-server.md), as values.
struct ShardProcessOptions {
  v1::TablesConfig tables;  // sent to the coordinator at registration
  uint64_t seed = 0;
  ConsistencyOptions consistency;
  uint32_t num_slots = 4096;
  int64_t max_rows_per_table = int64_t{1} << 26;
  int64_t max_ids_per_request = int64_t{1} << 22;
  std::string device = "cpu";
  int max_message_mb = 1024;
  int threads = 0;        // work threads (0: one per core)
  int store_threads = 0;  // threads of one large store call (0: per core)
  int move_streams = 2;
  int64_t move_chunk_bytes = int64_t{1} << 20;
  int move_max_rounds = 8;
  std::string listen = "127.0.0.1:0";
  std::string advertise;       // default: the listen host, bound port
  std::string zone;            // --zone: its failure domain, told at registration
  std::string metrics_listen;  // empty: no metrics
  std::string health_listen;   // empty: no plaintext health port
  std::string coordinator;     // empty: no registration
  bool standalone = false;     // serve every slot alone, epoch 1
  // Same-host rows (common/wire/same_host_memory.h): map the shared memory
  // of callers on loopback instead of carrying their rows through the socket.
  bool same_host_rows = true;
  // StoreOptions::prefault_fixed_share: the share of each fixed table's
  // rows this server expects to hold, whose memory is committed at start.
  // When > 0 (CPU store), each shard map installed also tops each fixed
  // table up to the share of its ids that map gives this server.
  double prefault_fixed_share = 0;
  rpc::CallGateOptions gate;
  // How its gRPC server and its calls to other shard servers (slot moves)
  // authenticate: the process's by default. A worker that embeds a shard
  // server gives it a shard certificate (its own is a worker's), so that
  // its peers accept its ExportRows and FinishMove calls.
  rpc::TransportSecurity security;
  // The coordinator refused the registration (recps-shard exits 2).
  std::function<void(const absl::Status&)> on_registration_refused;
};

class ShardProcess {
 public:
  // Builds the store and the ShardServer; nothing listens yet. Errors are
  // the configuration's (tables, device, limits): recps-shard exits 2.
  static absl::StatusOr<std::unique_ptr<ShardProcess>> Create(
      ShardProcessOptions options);
  // Starts the gRPC server, health and gauges, installs the standalone map
  // or registers with the coordinator. Errors are the environment's (a port
  // taken): recps-shard exits 1.
  absl::Status Serve();
  // Leaves the coordinator, ends slot moves, stops the gRPC server (calls
  // in flight get up to `grace`) and closes the ShardServer (a row file
  // being written is finished first). Idempotent. The metrics exposer is
  // left to the destructor (civetweb takes about a second to stop; both
  // binaries _exit instead).
  void Stop(absl::Duration grace);
  ~ShardProcess();

  ShardProcess(const ShardProcess&) = delete;
  ShardProcess& operator=(const ShardProcess&) = delete;

  // The address in shard maps (valid after Serve).
  const std::string& address() const { return advertise_; }
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  int num_tables() const { return static_cast<int>(specs_.size()); }
  // Whether the server holds a shard map that lists it.
  bool serving() const;
  // The server as an in-process endpoint for this process's embedding
  // client (valid after Serve, until Stop).
  client::InProcessShard* endpoint() const { return endpoint_.get(); }
  ShardServer& server() const { return *shard_; }

 private:
  explicit ShardProcess(ShardProcessOptions options);
  // Each map installed: commits, off the install path, the memory of the
  // fixed tables' rows it gives this server beyond what the start
  // committed (FixedRowCommitter), when prefault_fixed_share > 0.
  void CommitOwnedFixedRows();

  ShardProcessOptions options_;
  std::vector<config::TableSpec> specs_;
  // What it reports to the coordinator (RegisterRequest.capacity).
  v1::ServerSpec capacity_;
  std::unique_ptr<ThreadPool> compute_pool_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ShardMetrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int metrics_port_ = 0;
  std::unique_ptr<rpc::HealthPort> health_port_;
  std::atomic<grpc::HealthCheckServiceInterface*> health_{nullptr};
  std::unique_ptr<ShardServer> shard_;
  // Declared after shard_: stopped before the server it commits for goes.
  std::unique_ptr<FixedRowCommitter> committer_;
  std::unique_ptr<rpc::CallGate> gate_;
  std::unique_ptr<EmbeddingShardService> data_service_;
  std::unique_ptr<ShardAdminService> admin_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int grpc_port_ = 0;
  std::string advertise_;
  std::unique_ptr<client::InProcessShard> endpoint_;
  std::unique_ptr<client::CoordinatorClient> coordinator_;
  std::unique_ptr<client::CoordinatorLease> lease_;
  absl::Notification stop_gauges_;
  std::thread gauges_;
  bool stopped_ = false;
};

}  // namespace server
}  // namespace recps

#endif  // RECPS_SERVER_SHARD_SHARD_PROCESS_H_

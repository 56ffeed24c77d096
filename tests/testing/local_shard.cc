#include "tests/testing/local_shard.h"
#include "common/rpc/channels.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/launcher/process.h"
#include "common/wire/shard_map.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"


namespace recps::testing {

absl::StatusOr<int> RunProcess(const std::string& binary,
                               std::vector<std::string> args,
                               absl::Duration timeout) {
  // The recps daemons need TLS or --insecure: plaintext unless chosen.
  const size_t slash = binary.rfind('/');
  const std::string base = slash == std::string::npos ? binary : binary.substr(slash + 1);
  const bool has_security = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a.rfind("--tls_", 0) == 0 || a == "--insecure";
  });
  if (base.rfind("recps-", 0) == 0 && !has_security) args.push_back("--insecure");
  absl::StatusOr<pid_t> spawned = client::SpawnProcess(binary, args);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return absl::DeadlineExceededError(absl::StrCat(binary, " ran past ",
                                                  absl::FormatDuration(timeout)));
}

absl::StatusOr<std::unique_ptr<LocalShard>> LocalShard::Start(
    const std::string& binary, std::vector<std::string> args,
    absl::Duration timeout) {
  std::unique_ptr<LocalShard> shard(new LocalShard());
  const std::string port_file = shard->dir_.path() + "/ports";
  // A caller's --listen (a restart on a known port) wins over port 0.
  const bool has_listen = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a.rfind("--listen=", 0) == 0;
  });
  if (!has_listen) args.push_back("--listen=127.0.0.1:0");
  // Plaintext unless the caller chose TLS: the daemons need one or the other.
  const bool has_security = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a.rfind("--tls_", 0) == 0 || a == "--insecure";
  });
  if (!has_security) args.push_back("--insecure");
  args.push_back("--metrics_listen=127.0.0.1:0");
  args.push_back("--port_file=" + port_file);
  absl::StatusOr<pid_t> spawned = client::SpawnProcess(binary, args);
  if (!spawned.ok()) return spawned.status();
  shard->pid_ = *spawned;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(shard->pid_, &status, WNOHANG) == shard->pid_) {
      shard->pid_ = -1;
      return absl::InternalError(absl::StrCat(
          binary, " exited during start-up with status ", status));
    }
    std::ifstream in(port_file);
    int grpc_port = 0, metrics_port = 0;
    if (in >> grpc_port >> metrics_port && grpc_port > 0) {
      shard->address_ = absl::StrCat("127.0.0.1:", grpc_port);
      shard->metrics_port_ = metrics_port;
      return shard;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(binary, " did not start in time"));
}

absl::StatusOr<int> LocalShard::Terminate(absl::Duration timeout) {
  if (pid_ < 0) return absl::FailedPreconditionError("not running");
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("shard did not stop after SIGTERM");
}

void LocalShard::Kill() {
  if (pid_ < 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

LocalShard::~LocalShard() {
  if (pid_ >= 0 && !Terminate(absl::Seconds(5)).ok()) Kill();
}

absl::Status InstallShardMap(const std::vector<std::string>& servers,
                             uint64_t epoch, uint32_t num_slots) {
  const ShardMap map = ShardMap::Uniform(epoch, num_slots, servers);
  for (const std::string& server : servers) {
    auto stub = v1::ShardAdmin::NewStub(
        rpc::MakeChannel(server, rpc::ChannelKind::kControl));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SetShardMapRequest req;
    *req.mutable_shard_map() = map.ToProto();
    req.set_self(server);
    v1::SetShardMapResponse resp;
    const grpc::Status s = stub->SetShardMap(&ctx, req, &resp);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat(server, ": ", s.error_message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<LocalShard>>> StartShardCluster(
    const std::string& binary, const std::vector<std::string>& args, int count,
    uint32_t num_slots) {
  std::vector<std::unique_ptr<LocalShard>> shards;
  std::vector<std::string> addresses;
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> a = args;
    a.push_back(absl::StrCat("--num_slots=", num_slots));
    absl::StatusOr<std::unique_ptr<LocalShard>> shard = LocalShard::Start(binary, a);
    if (!shard.ok()) return shard.status();
    addresses.push_back((*shard)->address());
    shards.push_back(*std::move(shard));
  }
  if (absl::Status s = InstallShardMap(addresses, 1, num_slots); !s.ok()) return s;
  return shards;
}

absl::StatusOr<CoordinatedCluster> StartCoordinatedCluster(
    const std::string& coordinator_binary, const std::vector<std::string>& coordinator_args,
    const std::string& shard_binary, const std::vector<std::string>& shard_args, int count,
    const std::function<std::vector<std::string>(int)>& per_shard) {
  CoordinatedCluster cluster;
  absl::StatusOr<std::unique_ptr<LocalShard>> coordinator =
      LocalShard::Start(coordinator_binary, coordinator_args);
  if (!coordinator.ok()) return coordinator.status();
  cluster.coordinator = *std::move(coordinator);
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> args = shard_args;
    args.push_back("--coordinator=" + cluster.coordinator->address());
    if (per_shard) {
      for (std::string& a : per_shard(i)) args.push_back(std::move(a));
    }
    absl::StatusOr<std::unique_ptr<LocalShard>> shard = LocalShard::Start(shard_binary, args);
    if (!shard.ok()) return shard.status();
    cluster.addresses.push_back((*shard)->address());
    cluster.shards.push_back(*std::move(shard));
  }
  return cluster;
}

}  // namespace recps::testing

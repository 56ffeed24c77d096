#include "common/rpc/call_gate.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/rpc/channels.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace recps::rpc {
namespace {

constexpr uint32_t W = RoleBit(Role::kWorker);
constexpr uint32_t S = RoleBit(Role::kShard);
constexpr uint32_t C = RoleBit(Role::kCoordinator);
constexpr uint32_t R = RoleBit(Role::kReader);
constexpr uint32_t kAny = W | S | C | R;

// Who may call what besides admin (who may call everything). A method not
// listed here is admin-only, so a new RPC is closed until it is added.
const std::map<std::string, uint32_t, std::less<>>& Table() {
  static const auto* const table =
      new std::map<std::string, uint32_t, std::less<>>{
          // Data plane.
          {"EmbeddingShard.Lookup", W},
          {"EmbeddingShard.PushGradients", W},
          {"EmbeddingShard.PushGradientsShared", W},
          // Replication: a primary forwards each push to its backups.
          {"EmbeddingShard.ReplicatePush", S},
          // Shard servers' operations: the coordinator acts for admins.
          {"ShardAdmin.Stats", C | R},
          {"ShardAdmin.GetShardMap", W | S | C | R},
          {"ShardAdmin.SetShardMap", C},
          {"ShardAdmin.SaveRows", C},
          {"ShardAdmin.SaveRowsStatus", C},
          {"ShardAdmin.RestoreRows", C},
          // Slot moves: the coordinator drives them; the target streams the
          // rows from its source (ExportRows), the source hands the slots
          // over (FinishMove) or calls a failed hand-over off (AbortMove).
          {"ShardAdmin.MigrateIn", C},
          {"ShardAdmin.AllowExport", C},
          {"ShardAdmin.HandOver", C},
          {"ShardAdmin.AbortMove", C | S},
          {"ShardAdmin.ListMoves", C | R},
          {"ShardAdmin.ExportRows", S},
          {"ShardAdmin.FinishMove", S},

          // Coordinator: membership, rendezvous, checkpoints.
          {"Coordinator.Register", W | S},
          {"Coordinator.Heartbeat", W | S},
          {"Coordinator.Leave", W | S},
          {"Coordinator.GetShardMap", W | S | R},
          {"Coordinator.WatchShardMap", W | S | R},
          {"Coordinator.KvSet", W},
          {"Coordinator.KvGet", W | S},
          {"Coordinator.KvWait", W},
          {"Coordinator.Barrier", W},
          {"Coordinator.GetJob", W | S | R},
          {"Coordinator.ListMembers", R},
          {"Coordinator.GetPlan", R},
          {"Coordinator.ForgetMember", 0},
          {"Coordinator.CheckpointCut", W},
          {"Coordinator.RequestCheckpoint", 0},
          {"Coordinator.ListCheckpoints", R},
          {"Coordinator.GetResumeState", W},
          // Rebalancing: a plan only reads; applying one is an admin's.
          {"Coordinator.PlanRebalance", R},
          {"Coordinator.ApplyRebalance", 0},
          {"Coordinator.ListMoves", R},
          {"Health.Check", kAny},
          {"Health.Watch", kAny},
      };
  return *table;
}

// "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7" (the port changes per
// connection).
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos || colon < peer.find(':') + 1
             ? peer
             : peer.substr(0, colon);
}

constexpr int kLogsPerWindow = 10;
constexpr absl::Duration kLogWindow = absl::Seconds(10);
// Idle clients are forgotten once there are this many.
constexpr size_t kMaxTrackedClients = 4096;

}  // namespace

uint32_t AllowedRoles(absl::string_view method) {
  const auto& table = Table();
  auto it = table.find(method);
  const uint32_t listed = it == table.end() ? 0 : it->second;
  return listed | RoleBit(Role::kAdmin);
}

std::vector<std::pair<std::string, uint32_t>> RolesTable() {
  std::vector<std::pair<std::string, uint32_t>> out;
  for (const auto& [method, roles] : Table()) {
    out.emplace_back(method, roles | RoleBit(Role::kAdmin));
  }
  return out;
}

std::string DescribeRoles(uint32_t roles) {
  std::vector<std::string> names;
  // admin first: it is the one that may do everything.
  for (Role r : {Role::kAdmin, Role::kCoordinator, Role::kShard, Role::kWorker,
                 Role::kReader}) {
    if (roles & RoleBit(r)) names.push_back(RoleName(r));
  }
  if (names.empty()) return "no role";
  if (names.size() == 1) return names[0];
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

Admission& Admission::operator=(Admission&& other) noexcept {
  if (this != &other) {
    if (client_ != nullptr) gate_->Release(client_);
    gate_ = other.gate_;
    client_ = other.client_;
    peer_ = std::move(other.peer_);
    method_ = std::move(other.method_);
    client_key_ = std::move(other.client_key_);
    other.client_ = nullptr;
  }
  return *this;
}

Admission::~Admission() {
  if (client_ != nullptr) gate_->Release(client_);
}

void Admission::NoteBadRequest() {
  if (client_ != nullptr) gate_->NoteBad(client_, client_key_);
}

absl::Status Admission::Require(uint32_t roles, absl::string_view what) const {
  if (gate_ == nullptr || !gate_->enforcing()) return absl::OkStatus();
  if (roles & RoleBit(peer_.role)) return absl::OkStatus();
  gate_->CountDenied(method_, peer_.role, what);
  return absl::PermissionDeniedError(
      absl::StrCat("role '", RoleName(peer_.role), "' (", peer_.uri,
                   ") may not ", what, " (needs ", DescribeRoles(roles), ")"));
}

bool Admission::enforced() const { return gate_ != nullptr && gate_->enforcing(); }

absl::Status Admission::CheckRank(int64_t rank, absl::string_view what) const {
  if (gate_ == nullptr || !gate_->enforcing() || peer_.role != Role::kWorker) {
    return absl::OkStatus();
  }
  const std::optional<RankRange> bound = BoundRanks(peer_.name);
  if (!bound.has_value() || (rank >= bound->first && rank <= bound->last)) {
    return absl::OkStatus();
  }
  const std::string message = absl::StrCat(
      peer_.uri, " may act for ",
      bound->first == bound->last ? absl::StrCat("rank ", bound->first)
                                  : absl::StrCat("ranks ", bound->first, "..", bound->last),
      " only, not rank ", rank, " (", what, ")");
  gate_->CountDenied(method_, peer_.role, message);
  return absl::PermissionDeniedError(message);
}

CallGate::CallGate(bool enforce, CallGateOptions options,
                   prometheus::Registry* registry, std::string cluster)
    : enforce_(enforce), options_(options), cluster_(std::move(cluster)) {
  if (registry != nullptr) {
    denied_ =
        &prometheus::BuildCounter()
             .Name("recps_rpc_denied_total")
             .Help(
                 "RPCs refused because the caller's role may not make them, "
                 "by RPC and the caller's role")
             .Register(*registry);
    limited_ = &prometheus::BuildCounter()
                    .Name("recps_rpc_client_limited_total")
                    .Help(
                        "RPCs refused by a per-client limit, by RPC and reason "
                        "(concurrency, bad_requests)")
                    .Register(*registry);
  }
}

CallGate::CallGate(CallGateOptions options, prometheus::Registry* registry)
    : CallGate(
          Resolve(TransportSecurity()).mode == TransportSecurity::Mode::kTls,
          options, registry, OwnClusterOf(TransportSecurity())) {}

CallGate::~CallGate() = default;

void CallGate::CountDenied(absl::string_view method, Role role,
                           absl::string_view why) {
  if (denied_ != nullptr) {
    denied_->Add({{"rpc", std::string(method)}, {"role", RoleName(role)}})
        .Increment();
  }
  int64_t suppressed = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - last_log_ > kLogWindow) {
      last_log_ = now;
      logs_in_window_ = 0;
    }
    if (++logs_in_window_ > kLogsPerWindow) {
      ++suppressed_;
      return;
    }
    suppressed = std::exchange(suppressed_, 0);
  }
  LogWarning("refused ", method, ": ", why,
             suppressed > 0 ? absl::StrCat(" [", suppressed,
                                           " refusals not logged before this]")
                            : "");
}

void CallGate::CountLimited(absl::string_view method, const char* reason) {
  if (limited_ != nullptr) {
    limited_->Add({{"rpc", std::string(method)}, {"reason", reason}})
        .Increment();
  }
}

absl::Status CallGate::CheckRole(const PeerIdentity& peer, absl::string_view method) {
  if (!enforce_) return absl::OkStatus();
  if (!peer.authenticated || peer.role == Role::kNone) {
    const std::string why =
        peer.authenticated ? "the client certificate has no "
                             "spiffe://recps/<cluster>/<role>/<name> URI"
                           : "the client presented no verified certificate";
    CountDenied(method, Role::kNone, why);
    return absl::UnauthenticatedError(absl::StrCat(method, ": ", why));
  }
  if (!cluster_.empty() && peer.cluster != cluster_) {
    const std::string why = absl::StrCat("the client certificate ", peer.uri,
                                         " belongs to cluster '", peer.cluster,
                                         "', this server to '", cluster_, "'");
    CountDenied(method, peer.role, why);
    return absl::UnauthenticatedError(absl::StrCat(method, ": ", why));
  }
  const uint32_t allowed = AllowedRoles(method);
  if ((allowed & RoleBit(peer.role)) == 0) {
    const std::string message =
        absl::StrCat("role '", RoleName(peer.role), "' may not call ", method,
                     " (needs ", DescribeRoles(allowed), ")");
    CountDenied(method, peer.role,
                absl::StrCat(message, "; caller ", peer.uri));
    return absl::PermissionDeniedError(message);
  }
  return absl::OkStatus();
}

absl::StatusOr<Admission> CallGate::Admit(
    const grpc::ServerContextBase& context, absl::string_view method) {
  Admission admission;
  admission.gate_ = this;
  if (!enforce_) return admission;
  admission.method_ = std::string(method);
  admission.peer_ = IdentityOf(context);
  const PeerIdentity& peer = admission.peer_;
  if (absl::Status s = CheckRole(peer, method); !s.ok()) return s;
  // A client is an identity at one address: pods that share a certificate
  // (one Kubernetes Secret) are limited one by one.
  admission.client_key_ =
      absl::StrCat(peer.uri, " at ", PeerHost(context.peer()));
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (clients_.size() >= kMaxTrackedClients) {
    for (auto it = clients_.begin(); it != clients_.end();) {
      const Admission::Client& c = it->second;
      if (c.in_flight == 0 && c.refused_until <= now) {
        clients_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  Admission::Client& client = clients_[admission.client_key_];
  if (client.refused_until > now) {
    CountLimited(method, "bad_requests");
    return absl::UnavailableError(
        absl::StrCat(admission.client_key_, " is refused for ",
                     absl::FormatDuration(absl::Ceil(client.refused_until - now,
                                                     absl::Seconds(1))),
                     " more: it made more than ", options_.max_bad_requests,
                     " bad requests within ",
                     absl::FormatDuration(options_.bad_request_window),
                     " (--max_bad_requests_per_client); retry after that"));
  }
  if (options_.max_calls_per_client > 0 &&
      client.in_flight >= options_.max_calls_per_client) {
    CountLimited(method, "concurrency");
    return absl::ResourceExhaustedError(absl::StrCat(
        admission.client_key_, " has ", client.in_flight,
        " calls in flight, the limit per client is ",
        options_.max_calls_per_client, " (--max_calls_per_client)"));
  }
  ++client.in_flight;
  admission.client_ = &client;
  return admission;
}

void CallGate::Release(Admission::Client* client) {
  absl::MutexLock lock(&mu_);
  --client->in_flight;
}

void CallGate::NoteBad(Admission::Client* client, const std::string& key) {
  if (options_.max_bad_requests <= 0) return;
  const absl::Time now = absl::Now();
  bool refused = false;
  {
    absl::MutexLock lock(&mu_);
    if (now - client->window_start > options_.bad_request_window) {
      client->window_start = now;
      client->bad_in_window = 0;
    }
    if (++client->bad_in_window > options_.max_bad_requests &&
        client->refused_until <= now) {
      client->refused_until = now + options_.bad_request_penalty;
      client->bad_in_window = 0;
      refused = true;
    }
  }
  if (refused) {
    LogWarning("refusing ", key, " for ",
               absl::FormatDuration(options_.bad_request_penalty),
               ": more than ", options_.max_bad_requests,
               " bad requests within ",
               absl::FormatDuration(options_.bad_request_window));
  }
}

}  // namespace recps::rpc
